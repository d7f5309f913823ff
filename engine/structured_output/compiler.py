"""Structured-output specs compiled into xgrammar grammars, once per spec and tokenizer.

Compiling is the expensive part of constrained decoding (milliseconds to seconds, by the
schema and the vocabulary), so it never runs on the engine's step loop: the server awaits
it in a worker thread while the engine keeps stepping for everyone else, and identical specs
(a client sending the same schema all day) reuse one compiled grammar from the cache.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from officellm.engine.structured_output.json_schema_support import check_json_schema
from officellm.engine.structured_output.params import StructuredOutputError, StructuredOutputsParams

if TYPE_CHECKING:
    import xgrammar as xgr

# xgrammar's C++ errors start "[18:11:21] /project/cpp/regex_converter.cc:94: ".
_CPP_PREFIX = re.compile(r"^\[[^\]]*\]\s+\S+:\d+:\s*")
# Whitespace the JSON grammars allow in a row: enough for indented output, few enough that a
# small model cannot spend its whole max_tokens on newlines (a known failure of JSON modes).
MAX_JSON_WHITESPACE = 24
_WHAT = {"json": "The JSON schema", "json_object": "The JSON object grammar",
         "regex": "The regular expression", "choice": "The choice list",
         "grammar": "The grammar", "lark": "The Lark grammar", "structural_tag": "The structural tag"}


@dataclass
class CompilerStats:
    """Counters for /admin/stats and the benchmark: compilations and cache hits, and the
    seconds spent compiling (cold) and waiting for a cached or in-flight one (warm)."""

    compiles: int = 0
    cache_hits: int = 0
    compile_seconds: float = 0.0


class GrammarCompiler:
    """Compiles StructuredOutputsParams for one tokenizer; thread-safe.

    `vocab_size` is the width of the model's logits (it may exceed the tokenizer's), and
    `stop_token_ids` the ids that end a sequence: the grammar allows them exactly where the
    output is complete.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                 cache_size: int = 256, max_threads: int = 2) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._stop_token_ids = sorted(stop_token_ids)
        self._cache_size = cache_size
        self._max_threads = max_threads
        self._xgr: xgr.GrammarCompiler | None = None  # built on first use (~0.1-1 s)
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Future[xgr.CompiledGrammar]] = OrderedDict()
        self.stats = CompilerStats()

    def compile(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        """The compiled grammar of `params` (blocking: call it off the step loop). Raises
        StructuredOutputError when the spec is invalid, unsupported or does not compile."""
        key = params.cache_key()
        with self._lock:
            future = self._cache.get(key)
            owner = future is None
            if owner:
                future = Future()
                self._cache[key] = future
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
                self.stats.cache_hits += 1
        assert future is not None
        if not owner:
            return future.result()  # raises the owner's StructuredOutputError too
        started = time.perf_counter()
        try:
            compiled = self._compile(params)
        except BaseException as exc:
            with self._lock:  # a failure is not cached: the next request retries
                if self._cache.get(key) is future:
                    del self._cache[key]
            future.set_exception(exc)
            raise
        with self._lock:
            self.stats.compiles += 1
            self.stats.compile_seconds += time.perf_counter() - started
        future.set_result(compiled)
        return compiled

    def _compiler(self) -> xgr.GrammarCompiler:
        import xgrammar as xgr  # on the first structured request only (it loads transformers)

        with self._lock:
            if self._xgr is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self.vocab_size,
                    stop_token_ids=self._stop_token_ids)
                # Our cache above is the one cache: xgrammar's would hold a second copy.
                self._xgr = xgr.GrammarCompiler(info, max_threads=self._max_threads,
                                                cache_enabled=False)
            return self._xgr

    def _compile(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        compiler = self._compiler()
        kind = params.kind
        try:
            if kind == "json":
                schema = params.schema
                check_json_schema(schema)
                return compiler.compile_json_schema(json.dumps(schema),
                                                    max_whitespace_cnt=MAX_JSON_WHITESPACE)
            if kind == "json_object":
                # Not strict: strict mode would allow only {} for a schema with no properties.
                return compiler.compile_json_schema('{"type": "object"}', strict_mode=False,
                                                    max_whitespace_cnt=MAX_JSON_WHITESPACE)
            if kind == "regex":
                return compiler.compile_regex(params.regex)
            if kind == "choice":
                assert params.choice is not None
                return compiler.compile_grammar(
                    "root ::= " + " | ".join(json.dumps(c) for c in params.choice))
            if kind == "grammar":
                return compiler.compile_grammar(params.grammar)
            if kind == "lark":
                import xgrammar as xgr
                return compiler.compile_grammar(xgr.Grammar.from_lark(params.lark))
            return compiler.compile_structural_tag(params.structural_tag)
        except StructuredOutputError:
            raise
        except (RuntimeError, ValueError, TypeError) as exc:
            reason = _CPP_PREFIX.sub("", str(exc)).strip().rstrip(".")
            raise StructuredOutputError(f"{_WHAT[kind]} does not compile: {reason}.") from None
