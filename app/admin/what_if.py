"""POST /admin/plan: `officellm plan` asked over the admin API, for a model and memory budget
that need not be the loaded ones (the console's Capacity what-if; docs/admin_api.md).

The console knows the server only through this API (docs/design.md §12), so the arithmetic
stays here, in engine.kv_plan, and the console shows the answer. Nothing here needs the loaded
model: it answers while the model loads, and after a load failed. Each input is checked at
this boundary, so a bad value is a 400 naming its field rather than a 500 from deep inside.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from officellm.app.admin.views import WhatIfPlan
from officellm.app.errors import APIError
from officellm.engine import (
    check_kv_cache_dtype,
    dtype_bytes,
    format_plan,
    gguf_weight_bytes,
    load_spec,
    make_plan,
    parse_memory,
)

router = APIRouter()


class WhatIf(BaseModel):
    """The question, with `officellm plan`'s defaults."""

    model: str = Field(min_length=1, description=(
        "A shipped config's name (e.g. Qwen2.5-7B-Instruct), or a model directory, config.json "
        "or .gguf on the server's machine."))
    memory: str = Field("80GiB", description="Memory per GPU, e.g. 80GiB, 512MiB or a byte count.")
    dtype: str = Field("bf16", description="The weights' dtype: bf16, fp16 or fp32.")
    kv_cache_dtype: str = Field("auto", description=(
        "What the KV cache is stored in (--kv-cache-dtype): auto (the dtype), float16, "
        "bfloat16, fp8_e4m3, fp8_e5m2 or int8."))
    max_model_len: int | None = Field(None, ge=1, description=(
        "The longest request; null: the model's own maximum."))
    avg_tokens: int = Field(4000, ge=1, description="A typical thread's length, in tokens.")
    device: Literal["cuda", "cpu"] = Field("cuda", description=(
        "Where the model runs: on the cpu a .gguf's weights are held in its blocks."))


def _bad(param: str, message: str) -> APIError:
    return APIError(400, message, param=param)


@router.post("/plan")
def post_plan(body: WhatIf) -> WhatIfPlan:
    """The plan and its printed report; 400 (naming the field) for a value it cannot use."""
    try:
        memory_bytes = parse_memory(body.memory)
    except ValueError as exc:
        raise _bad("memory", str(exc)) from exc
    except OverflowError as exc:  # digits past a float's range: "1e400" bytes
        raise _bad("memory", f"Memory size {body.memory!r} is too large.") from exc
    try:
        dtype_bytes(body.dtype)
    except ValueError as exc:
        raise _bad("dtype", str(exc)) from exc
    try:
        check_kv_cache_dtype(body.kv_cache_dtype)
    except ValueError as exc:
        raise _bad("kv_cache_dtype", str(exc)) from exc
    try:
        spec, name = load_spec(body.model)
    except (OSError, ValueError) as exc:  # no such model, or an unsupported architecture
        raise _bad("model", str(exc)) from exc
    except KeyError as exc:  # a config.json without a field every model has
        raise _bad("model", f"Cannot read a model config from {body.model!r}: it has no "
                            f"{exc}.") from exc
    plan = make_plan(spec, name, memory_bytes, body.dtype, body.max_model_len, body.avg_tokens,
                     kv_cache_dtype=body.kv_cache_dtype,
                     held_weight_bytes=gguf_weight_bytes(body.model, body.dtype, body.device))
    return WhatIfPlan(plan=plan, text=format_plan(plan))
