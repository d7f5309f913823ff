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
from officellm.engine.core.kv_cache_groups import KVCacheGroups
from officellm.engine.loading.model_spec import ModelSpec
from officellm.engine.models.shard_plan import ShardPlan
from officellm.engine.precision.kv_cache_dtype import kv_dtype_bytes

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
        from officellm.engine.loading.gguf_config import hf_config
        from officellm.engine.loading.gguf_layout import read_layout

        return ModelSpec.from_config_dict(hf_config(read_layout(path))), path.stem
    names = {n.lower(): n for n in shipped_configs()}
    key = model.lower().split("/")[-1]
    if key in names:
        text = (resources.files("officellm.engine") / "model_configs" / f"{names[key]}.json").read_text()
        return ModelSpec.from_config_dict(json.loads(text)), names[key]
    raise FileNotFoundError(
        f"No model {model!r}: give a model directory, a config.json, a .gguf, or one of the "
        f"shipped configs: {', '.join(shipped_configs())}."
    )


def kv_block_bytes(spec: ModelSpec, groups: KVCacheGroups, kv_nbytes: int, scale_bytes: int,
                   block_size: int, tensor_parallel_size: int = 1) -> int:
    """Bytes of one KV block on one rank: K and V pages of block_size tokens in each of the
    pool's `layers_per_block` tensors (all layers, for a model of one attention type)."""
    kv_heads = max(1, -(-spec.num_kv_heads // tensor_parallel_size))
    return (2 * groups.layers_per_block * kv_heads * (spec.head_dim * kv_nbytes + scale_bytes)
            * block_size)


@dataclass
class KVPlan:
    """The arithmetic of docs/design.md §4 for one model, dtype and memory budget.

    `bytes_per_token` is what a token costs while every layer holds it; a model with
    sliding-window layers (`sliding_layers` of them see the last `sliding_window` tokens)
    lets go of those layers' older tokens, so what a request of n tokens holds is counted in
    blocks (engine/core/kv_cache_groups.py) and the concurrencies are blocks over blocks.
    """

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
    block_bytes: int = 0  # one block (block_size tokens of the pool's layers per block)
    num_layers: int = 0
    sliding_layers: int = 0  # layers that see only the last sliding_window tokens
    sliding_window: int | None = None
    blocks_at_max_len: int = 0  # what one request of max_model_len tokens holds
    blocks_at_avg: int = 0  # what one request of avg_tokens holds
    host_tier_bytes: int = 0  # --kv-offloading-size: RAM for blocks that left the pool

    def to_dict(self) -> dict:
        return asdict(self)

    def groups(self) -> KVCacheGroups:
        """The model's KV cache groups (as many of each window as the model has)."""
        full = self.num_layers - self.sliding_layers
        return KVCacheGroups.for_windows([None] * full
                                         + [self.sliding_window] * self.sliding_layers)

    @property
    def host_tier_tokens(self) -> int:
        """The tokens of prefix cache the host tier keeps (blocks of every group alike)."""
        blocks = self.host_tier_bytes // self.block_bytes if self.block_bytes else 0
        return self.groups().max_tokens_in(blocks, self.block_size)

    def bytes_held(self, num_tokens: int) -> int:
        """What a request of `num_tokens` holds of the pool, in bytes."""
        return self.groups().blocks_held(num_tokens, self.block_size) * self.block_bytes


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
    held_weight_bytes: int | None = None,
    host_tier_bytes: int = 0,
) -> KVPlan:
    """Size the KV pool that fits beside the weights in `memory_bytes` (per GPU under TP:
    the largest rank's share of the weights and of the KV heads; raises
    TensorParallelSplitError for a split the engine cannot run). The KV cache is stored in
    `kv_cache_dtype` (`--kv-cache-dtype`: auto is `dtype`; fp8 halves a 16-bit cache). A
    model with sliding-window layers is counted per KV cache group: its sliding layers hold a
    window's tokens whatever the request's length. `held_weight_bytes`: the weights as the
    engine will hold them, where that is not the parameters in `dtype` (a GGUF's blocks on
    the CPU: gguf_weight_bytes). `host_tier_bytes`: RAM for a host tier below the pool
    (--kv-offloading-size), reported beside it."""
    nbytes = dtype_bytes(dtype)
    kv_nbytes, scale_bytes = kv_dtype_bytes(kv_cache_dtype, nbytes)
    tp = tensor_parallel_size
    per_token = spec.kv_bytes_per_token(kv_nbytes, tp, scale_bytes)
    groups = KVCacheGroups.for_windows(spec.layer_windows)
    block = kv_block_bytes(spec, groups, kv_nbytes, scale_bytes, block_size, tp)
    weights = weight_bytes(spec, nbytes, tp) if held_weight_bytes is None else held_weight_bytes
    pool = max(0, memory_bytes - weights - overhead_bytes)
    num_blocks = pool // block
    mml = max_model_len or spec.max_position_embeddings
    at_max = groups.blocks_held(mml, block_size)
    at_avg = groups.blocks_held(avg_tokens, block_size)
    windows = [w for w in spec.layer_windows if w is not None]
    return KVPlan(
        model=model_name, dtype_bytes=nbytes, bytes_per_token=per_token, weight_bytes=weights,
        memory_bytes=memory_bytes, pool_bytes=pool, block_size=block_size,
        num_blocks=num_blocks, pool_tokens=groups.max_tokens_in(num_blocks, block_size),
        max_model_len=mml, concurrency_at_max_len=num_blocks / at_max,
        avg_tokens=avg_tokens, concurrency_at_avg=num_blocks / at_avg,
        tensor_parallel_size=tp, kv_cache_dtype=kv_cache_dtype, kv_dtype_bytes=kv_nbytes,
        kv_scale_bytes=scale_bytes, block_bytes=block, num_layers=spec.num_layers,
        sliding_layers=len(windows), sliding_window=spec.sliding_window if windows else None,
        blocks_at_max_len=at_max, blocks_at_avg=at_avg, host_tier_bytes=host_tier_bytes,
    )


# Bytes per weight of a format experts are kept in: MXFP4's 17-byte blocks of 32.
EXPERT_FORMAT_BYTES = {"mxfp4": 17 / 32}


def gguf_weight_bytes(model: str, dtype: str, device: str, tensor_parallel_size: int = 1
                      ) -> int | None:
    """For a .gguf served on the CPU by one rank, the bytes its weights are held in there
    (the file's blocks, read in place; the rest at `dtype`); None for anything else, whose
    weights are the parameters in `dtype` (a GPU's Triton matmuls read dense weights)."""
    path = Path(model).expanduser()
    if path.suffix != ".gguf" or not path.is_file() or device != "cpu" or tensor_parallel_size != 1:
        return None
    from officellm.engine.loading.gguf_tensors import held_weight_bytes

    return held_weight_bytes(path, dtype_bytes(dtype))


def weight_bytes(spec: ModelSpec, nbytes: int, tensor_parallel_size: int = 1) -> int:
    """The largest rank's weights at `nbytes` per weight, every expert resident (in its
    checkpoint's format where the engine keeps it: gpt-oss's MXFP4)."""
    expert_bytes = EXPERT_FORMAT_BYTES.get(spec.expert_format or "", nbytes)
    sizes = []
    for rank in range(tensor_parallel_size):
        plan = ShardPlan.for_rank(spec, rank, tensor_parallel_size)
        experts = plan.num_expert_weights(spec)
        sizes.append(int(nbytes * (plan.num_parameters(spec) - experts)
                         + expert_bytes * experts))
    return max(sizes)


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
    ]
    if plan.sliding_layers:
        lines.append(
            f"  {plan.sliding_layers} of {plan.num_layers} layers slide: they keep only the "
            f"last {plan.sliding_window:,} tokens of a request, whatever its length")
    lines += [
        f"  a {plan.avg_tokens:,}-token chat: {plan.bytes_held(plan.avg_tokens) / 1e6:,.0f} MB; "
        f"{plan.max_model_len:,} tokens: {plan.bytes_held(plan.max_model_len) / 1e9:,.2f} GB",
        f"Weights: {format_gib(plan.weight_bytes)}{per_gpu}",
        f"Memory: {format_gib(plan.memory_bytes)}{per_gpu} -> KV pool {format_gib(plan.pool_bytes)}",
        f"KV cache size: {plan.pool_tokens:,} tokens ({plan.num_blocks:,} blocks of "
        f"{plan.block_size}; {plan.block_bytes // plan.block_size:,} B/token)"
        + (" for one request" if plan.sliding_layers else ""),
        f"Maximum concurrency for {plan.max_model_len:,} tokens per request: "
        f"{plan.concurrency_at_max_len:.2f}x",
        f"Concurrency for {plan.avg_tokens:,}-token chats: {plan.concurrency_at_avg:.2f}x",
    ]
    if plan.host_tier_bytes:
        lines.append(
            f"Host tier: {format_gib(plan.host_tier_bytes)} of RAM -> {plan.host_tier_tokens:,} "
            f"more tokens of prefix cache ({plan.host_tier_tokens / plan.avg_tokens:.1f} "
            f"{plan.avg_tokens:,}-token chats) copied back instead of computed")
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
    block_bytes: int,
    block_size: int,
    max_model_len: int | None,
    memory_flag: str,
    groups: KVCacheGroups | None = None,
    chunk: int = 1,
) -> tuple[int, int]:
    """Blocks in the pool and the max_model_len served; log docs/design.md §3's lines.

    An explicit max_model_len that cannot hold one request is refused with the numbers;
    without one, the model's maximum is used if it fits, else the largest length that does.
    block_bytes: one KV block on one rank (kv_block_bytes). A request must fit while its
    last prompt chunk (`chunk`, the step's token budget) runs: a sliding layer then holds its
    window plus the chunk.
    """
    check_max_model_len(spec, max_model_len)
    groups = groups or KVCacheGroups.for_windows(spec.layer_windows)
    num_blocks = max(0, available_bytes) // block_bytes
    per_token = block_bytes // block_size

    def fits(tokens: int) -> bool:
        return groups.blocks_held(tokens, block_size, min(chunk, tokens)) <= num_blocks

    largest = groups.max_tokens_in(num_blocks, block_size, chunk)
    if max_model_len is None:
        max_model_len = spec.max_position_embeddings
        if not fits(max_model_len):
            if largest < 2 * block_size:
                raise KVCacheTooSmallError(_refusal(groups, block_bytes, available_bytes,
                                                    block_size, max_model_len, largest,
                                                    memory_flag, chunk))
            logger.info(
                "max_model_len set to %s: the model's %s tokens do not fit in the KV pool",
                f"{largest:,}", f"{spec.max_position_embeddings:,}",
            )
            max_model_len = largest
    elif not fits(max_model_len):
        raise KVCacheTooSmallError(_refusal(groups, block_bytes, available_bytes, block_size,
                                            max_model_len, largest, memory_flag, chunk))
    held = groups.blocks_held(max_model_len, block_size)
    logger.info("Available KV cache memory: %s", format_gib(available_bytes))
    if groups.uniform:
        logger.info("KV cache size: %s tokens (%s blocks of %d; %s B/token)",
                    f"{num_blocks * block_size:,}", f"{num_blocks:,}", block_size,
                    f"{per_token:,}")
    else:
        sliding = sum(len(g.layers) for g in groups.groups if g.window is not None)
        logger.info("KV cache size: %s blocks of %d (%s B/token of a block; %d KV cache "
                    "groups: %d of %d layers slide over their last %s tokens); one request "
                    "holds up to %s tokens", f"{num_blocks:,}", block_size, f"{per_token:,}",
                    groups.num_groups, sliding, groups.num_layers,
                    f"{max(w for w in groups.windows if w is not None):,}", f"{largest:,}")
    logger.info("Maximum concurrency for %s tokens per request: %.2fx",
                f"{max_model_len:,}", num_blocks / held)
    return num_blocks, max_model_len


def _refusal(groups: KVCacheGroups, block_bytes: int, available: int, block_size: int,
             max_model_len: int, largest: int, memory_flag: str, chunk: int) -> str:
    needed = groups.blocks_held(max_model_len, block_size, min(chunk, max_model_len)) * block_bytes
    per_token = block_bytes // block_size
    return (
        f"One request of max_model_len={max_model_len:,} tokens needs {format_gib(needed)} of KV "
        f"cache ({per_token:,} B/token), but only {format_gib(available)} is available for it; "
        f"the largest max_model_len that fits is {largest:,}. Fixes: lower --max-model-len "
        f"(to {largest:,} or less), raise {memory_flag}, use a machine with more memory, or "
        f"split the model with --tensor-parallel-size."
    )
