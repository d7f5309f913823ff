"""One registered model, as the registry table, the CLI, the admin API and the server's
model pool all see it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GENERATE, EMBED, TRANSCRIBE, RERANK = "generate", "embed", "transcribe", "rerank"
# Vision is not a kind: it is what a generate model's checkpoint can do (its vision tower).
KINDS = (GENERATE, EMBED, TRANSCRIBE, RERANK)
# `source` of the bundled models: SmolLM2-135M-Instruct (generate) or all-MiniLM-L6-v2 (embed).
BUNDLED = "bundled"
# Serve options an entry may set; everything else is the server's (its flags).
ENGINE_OPTIONS = ("dtype", "quantization", "kv_cache_dtype", "max_model_len", "kv_cache_memory")
# The options whose value is a whole number; the others' are strings.
INT_OPTIONS = ("max_model_len",)
# engine/precision/dtype_choice.py's names, not imported from there: it loads torch, which the CLI's
# data commands must not wait for.
DTYPES = ("auto", "float32", "fp32", "float", "bfloat16", "bf16", "float16", "fp16", "half")
PARSER_OPTIONS = {"tool_call_parser": ("auto", "hermes", "llama3_json", "harmony", "none"),
                  "reasoning_parser": ("auto", "qwen3", "deepseek_r1", "harmony", "none")}


@dataclass(frozen=True)
class ModelEntry:
    """A model the server serves by `name`: where it comes from, what it does, how it is
    served. `pinned` models are loaded at start and never unloaded to make room."""

    name: str
    source: str  # a Hugging Face directory, a .gguf file, or BUNDLED
    kind: str = GENERATE
    pinned: bool = False
    aliases: tuple[str, ...] = ()  # glob patterns of request names that reach this model
    sleep_idle_seconds: float | None = None  # None: the server's --sleep-idle-seconds
    options: dict[str, Any] = field(default_factory=dict)  # ENGINE_OPTIONS and PARSER_OPTIONS
    hub_repo: str | None = None  # the Hub repo id `officellm models pull` fetched it from

    def check(self) -> None:
        """ValueError naming what is wrong with this entry (the CLI and the admin API ask
        before anything is stored)."""
        # Here, not at the top: the engine's package loads torch (seconds), and reading or
        # listing entries (`officellm models list`) needs none of it.
        from officellm.engine import EngineConfig, parse_memory

        if not self.name or len(self.name) > 128 or any(c.isspace() for c in self.name):
            raise ValueError(f"A model name is 1 to 128 characters without spaces, not "
                             f"{self.name!r}.")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be {' or '.join(KINDS)}, not {self.kind!r}.")
        if not self.source:
            raise ValueError("source is a model directory, a .gguf file or 'bundled'.")
        if self.sleep_idle_seconds is not None and self.sleep_idle_seconds < 0:
            raise ValueError("sleep_idle_seconds must be 0 (never) or more.")
        unknown = set(self.options) - set(ENGINE_OPTIONS) - set(PARSER_OPTIONS)
        if unknown:
            raise ValueError(f"Unknown serve option(s) {', '.join(sorted(unknown))}; an entry "
                             f"may set {', '.join(ENGINE_OPTIONS + tuple(PARSER_OPTIONS))}.")
        for key, value in self.engine_options().items():
            # JSON may carry any type: a wrong one must be a sentence here, not a TypeError
            # deep in the engine's checks.
            if key in INT_OPTIONS and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"{key} must be a whole number, not {value!r}.")
            if key not in INT_OPTIONS and not isinstance(value, str):
                raise ValueError(f"{key} must be a string, not {value!r}.")
        for key, choices in PARSER_OPTIONS.items():
            if key in self.options and self.options[key] not in choices:
                raise ValueError(f"{key} must be one of {', '.join(choices)}.")
        if "dtype" in self.options and str(self.options["dtype"]).lower() not in DTYPES:
            # EngineConfig takes any string; the engine refuses it only when the model loads.
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, not "
                             f"{self.options['dtype']!r}.")
        if "kv_cache_memory" in self.options:
            parse_memory(self.options["kv_cache_memory"])
        EngineConfig(**self.engine_options())  # the engine's own checks of its knobs

    def engine_options(self) -> dict[str, Any]:
        """The options that are EngineConfig knobs."""
        return {k: v for k, v in self.options.items() if k in ENGINE_OPTIONS}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "kind": self.kind,
                "pinned": self.pinned, "aliases": list(self.aliases),
                "sleep_idle_seconds": self.sleep_idle_seconds, "options": dict(self.options),
                "hub_repo": self.hub_repo}
