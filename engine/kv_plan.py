"""KV-cache arithmetic: how many tokens, and so how many chats, fit in a given memory.

Shared by `officellm plan`, the engine's start-up sizing and the admin console.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from officellm.engine.config import format_gib
from officellm.engine.kv_cache_dtype import kv_dtype_bytes
from officellm.engine.loading.model_spec import ModelSpec
from officellm.engine.models.shard_plan import ShardPlan

logger = logging.getLogger("officellm.engine.kv_plan")

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
               "half": 2, "float": 4}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise ValueError(f"Unknown dtype {dtype!r}; use one of bf16, fp16, fp32.") from None


def shipped_configs() -> list[str]:
    """Names of the model configs shipped in engine/model_configs/."""
    root = resources.files("officellm.engine") / "model_configs"
    return sorted(p.name.removesuffix(".json") for p in root.iterdir() if p.name.endswith(".json"))


def load_spec(model: str) -> tuple[ModelSpec, str]:
    """A ModelSpec from a model directory, a config.json, a .gguf or a shipped config's name."""
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSpec.from_json(path / "config.json"), path.name
    if path.is_file() and path.suffix == ".json":
        return ModelSpec.from_json(path), path.parent.name
    if path.is_file() and path.suffix == ".gguf":
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        cfg = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
        return ModelSpec.from_config_dict(cfg), path.stem
    names = {n.lower(): n for n in shipped_configs()}
    key = model.lower().split("/")[-1]
    if key in names:
        text = (resources.files("officellm.engine") / "model_configs" / f"{names[key]}.json").read_text()
        return ModelSpec.from_config_dict(json.loads(text)), names[key]
    raise FileNotFoundError(
        f"No model {model!r}: give a model directory, a config.json, a .gguf, or one of the "
        f"shipped configs: {', '.join(shipped_configs())}."
    )


@dataclass
class KVPlan:
    """The arithmetic of docs/design.md §4 for one model, dtype and memory budget."""

    model: str
    dtype_bytes: int  # per weight
    bytes_per_token: int
    weight_bytes: int
    memory_bytes: int
    pool_bytes: int
    block_size: int
    num_blocks: int
    pool_tokens: int
    max_model_len: int
    concurrency_at_max_len: float
    avg_tokens: int
    concurrency_at_avg: float
    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype; auto: the weights' dtype
    kv_dtype_bytes: int = 0  # per stored key or value element
    kv_scale_bytes: int = 0  # per stored row of head_dim elements (int8's scale)

    def to_dict(self) -> dict:
        return asdict(self)


def make_plan(
    spec: ModelSpec,
    model_name: str,
    memory_bytes: int,
    dtype: str = "bf16",
    max_model_len: int | None = None,
    avg_tokens: int = 4000,
    block_size: int = 16,
    tensor_parallel_size: int = 1,
    overhead_bytes: int = 0,
    kv_cache_dtype: str = "auto",
) -> KVPlan:
    """Size the KV pool that fits beside the weights in `memory_bytes` (per GPU under TP:
    the largest rank's share of the weights and of the KV heads; raises
    TensorParallelSplitError for a split the engine cannot run). The KV cache is stored in
    `kv_cache_dtype` (`--kv-cache-dtype`: auto is `dtype`; fp8 halves a 16-bit cache)."""
    nbytes = dtype_bytes(dtype)
    kv_nbytes, scale_bytes = kv_dtype_bytes(kv_cache_dtype, nbytes)
    tp = tensor_parallel_size
    per_token = spec.kv_bytes_per_token(kv_nbytes, tp, scale_bytes)
    weights = nbytes * max(ShardPlan.for_rank(spec, r, tp).num_parameters(spec) for r in range(tp))
    pool = max(0, memory_bytes - weights - overhead_bytes)
    num_blocks = pool // (per_token * block_size)
    pool_tokens = num_blocks * block_size
    mml = max_model_len or spec.max_position_embeddings
    return KVPlan(
        model=model_name, dtype_bytes=nbytes, bytes_per_token=per_token, weight_bytes=weights,
        memory_bytes=memory_bytes, pool_bytes=pool, block_size=block_size,
        num_blocks=num_blocks, pool_tokens=pool_tokens, max_model_len=mml,
        concurrency_at_max_len=pool_tokens / mml, avg_tokens=avg_tokens,
        concurrency_at_avg=pool_tokens / avg_tokens, tensor_parallel_size=tp,
        kv_cache_dtype=kv_cache_dtype, kv_dtype_bytes=kv_nbytes, kv_scale_bytes=scale_bytes,
    )


def format_plan(plan: KVPlan) -> str:
    """The human report `officellm plan` prints."""
    per_gpu = " per GPU" if plan.tensor_parallel_size > 1 else ""
    lines = [
        f"Model: {plan.model}"
        + (f" (tensor parallel {plan.tensor_parallel_size})" if plan.tensor_parallel_size > 1 else ""),
        f"KV cache per token: {plan.bytes_per_token:,} bytes{per_gpu} "
        f"(2 x layers x kv_heads x "
        + (f"(head_dim x {plan.kv_dtype_bytes} B + a {plan.kv_scale_bytes} B scale)"
           if plan.kv_scale_bytes else f"head_dim x {plan.kv_dtype_bytes or plan.dtype_bytes} B")
        + (f", {plan.kv_cache_dtype}" if plan.kv_cache_dtype != "auto" else "") + ")",
        f"  a {plan.avg_tokens:,}-token chat: {plan.bytes_per_token * plan.avg_tokens / 1e6:,.0f} MB; "
        f"{plan.max_model_len:,} tokens: {plan.bytes_per_token * plan.max_model_len / 1e9:,.2f} GB",
        f"Weights: {format_gib(plan.weight_bytes)}{per_gpu}",
        f"Memory: {format_gib(plan.memory_bytes)}{per_gpu} -> KV pool {format_gib(plan.pool_bytes)}",
        f"KV cache size: {plan.pool_tokens:,} tokens ({plan.num_blocks:,} blocks of "
        f"{plan.block_size}; {plan.bytes_per_token:,} B/token)",
        f"Maximum concurrency for {plan.max_model_len:,} tokens per request: "
        f"{plan.concurrency_at_max_len:.2f}x",
        f"Concurrency for {plan.avg_tokens:,}-token chats: {plan.concurrency_at_avg:.2f}x",
    ]
    if plan.pool_tokens < plan.max_model_len:
        lines.append(
            f"WARNING: one request of {plan.max_model_len:,} tokens does not fit; the largest "
            f"that fits is {plan.pool_tokens:,}."
        )
    return "\n".join(lines)


class KVCacheTooSmallError(RuntimeError):
    """One request of max_model_len tokens does not fit in the KV pool."""


# vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN, under our prefix: the operator knows the model was
# extended (or accepts answers that degrade past its window).
ALLOW_LONG_MAX_MODEL_LEN = "OFFICELLM_ALLOW_LONG_MAX_MODEL_LEN"


# RoPE scalings whose factor stretches max_position_embeddings (vLLM's reading); llama3's and
# longrope's configs already state the stretched length there.
_STRETCHING_ROPE_TYPES = frozenset({"yarn", "linear", "dynamic"})


def model_window(spec: ModelSpec) -> int:
    """The longest context the model is made for: max_position_embeddings, times a YaRN,
    linear or dynamic RoPE scaling's factor (Qwen2.5's YaRN x4 serves 131,072 tokens)."""
    scaling = spec.rope_scaling or {}
    factor = scaling.get("factor") if scaling.get("rope_type") in _STRETCHING_ROPE_TYPES else None
    return int(spec.max_position_embeddings * factor) if factor else spec.max_position_embeddings


def check_max_model_len(spec: ModelSpec, max_model_len: int | None) -> None:
    """ValueError for a max_model_len beyond the window the model was made for
    (model_window), unless ALLOW_LONG_MAX_MODEL_LEN is 1: positions past it were never seen,
    and answers there degrade without any error to say so."""
    window = model_window(spec)
    if max_model_len is None or max_model_len <= window:
        return
    if os.environ.get(ALLOW_LONG_MAX_MODEL_LEN) == "1":
        logger.warning("max_model_len %s is beyond the model's trained window of %s tokens "
                       "(%s=1): answers past it may degrade", f"{max_model_len:,}",
                       f"{window:,}", ALLOW_LONG_MAX_MODEL_LEN)
        return
    raise ValueError(f"--max-model-len {max_model_len:,} is beyond the {window:,} tokens this "
                     f"model was made for (max_position_embeddings in its config.json, times "
                     f"its RoPE scaling's factor); "
                     f"positions past them give answers that degrade without an error. Use "
                     f"--max-model-len {window:,} or less, or set {ALLOW_LONG_MAX_MODEL_LEN}=1 "
                     f"if the model was extended or you accept that.")


def size_pool(
    spec: ModelSpec,
    available_bytes: int,
    per_token: int,
    block_size: int,
    max_model_len: int | None,
    memory_flag: str,
) -> tuple[int, int]:
    """Blocks in the pool and the max_model_len served; log docs/design.md §3's lines.

    An explicit max_model_len that cannot hold one request is refused with the numbers;
    without one, the model's maximum is used if it fits, else the largest length that does.
    per_token: the KV cache's bytes per token on one rank (engine.kv_cache_dtype).
    """
    check_max_model_len(spec, max_model_len)
    num_blocks = max(0, available_bytes) // (per_token * block_size)
    pool_tokens = num_blocks * block_size
    if max_model_len is None:
        max_model_len = spec.max_position_embeddings
        if pool_tokens < max_model_len:
            if pool_tokens < 2 * block_size:
                raise KVCacheTooSmallError(_refusal(per_token, available_bytes, block_size,
                                                    max_model_len, pool_tokens, memory_flag))
            logger.info(
                "max_model_len set to %s: the model's %s tokens do not fit in the KV pool",
                f"{pool_tokens:,}", f"{spec.max_position_embeddings:,}",
            )
            max_model_len = pool_tokens
    elif pool_tokens < max_model_len:
        raise KVCacheTooSmallError(_refusal(per_token, available_bytes, block_size,
                                            max_model_len, pool_tokens, memory_flag))
    logger.info("Available KV cache memory: %s", format_gib(available_bytes))
    logger.info("KV cache size: %s tokens (%s blocks of %d; %s B/token)",
                f"{pool_tokens:,}", f"{num_blocks:,}", block_size, f"{per_token:,}")
    logger.info("Maximum concurrency for %s tokens per request: %.2fx",
                f"{max_model_len:,}", pool_tokens / max_model_len)
    return num_blocks, max_model_len


def _refusal(per_token: int, available: int, block_size: int, max_model_len: int,
             pool_tokens: int, memory_flag: str) -> str:
    needed = -(-max_model_len // block_size) * block_size * per_token
    return (
        f"One request of max_model_len={max_model_len:,} tokens needs {format_gib(needed)} of KV "
        f"cache ({per_token:,} B/token), but only {format_gib(available)} is available for it; "
        f"the largest max_model_len that fits is {pool_tokens:,}. Fixes: lower --max-model-len "
        f"(to {pool_tokens:,} or less), raise {memory_flag}, use a machine with more memory, or "
        f"split the model with --tensor-parallel-size."
    )
