"""Run as `python -m tests.support.engine_report MODEL_DIR PROMPTS_JSON` in a subprocess whose
environment a test controls (e.g. a CPU level cap): prints one JSON line saying what the
engine decided there and what it generated.

Fields: pack_error (what oneDNN says when asked to pack a bf16 weight here; None if it
packs), can_pack, dtype_auto (what `--dtype auto` resolved to), and per dtype run
("auto", "bfloat16"): the engine's dtype, whether its weights were packed, and the greedy
token ids of each prompt.
"""

from __future__ import annotations

import json
import sys

import torch


def pack_error() -> str | None:
    from officellm.engine.models import packed_linear

    try:
        packed_linear.pack(torch.zeros(32, 32, dtype=torch.bfloat16))
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return None


def main(model_dir: str, prompts_json: str, max_tokens: int = 16) -> dict:
    from officellm.engine import LLM, SamplingParams
    from officellm.engine.models import packed_linear

    prompts = json.loads(prompts_json)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    report: dict = {"pack_error": pack_error(),
                    "can_pack": packed_linear.can_pack(torch.device("cpu"), torch.bfloat16)}
    for dtype in ("auto", "bfloat16"):
        # auto is float32 under the AVX2 cap this runs with: its cache float32 too, so its
        # tokens are the float32 engine's (transformers').
        llm = LLM(model_dir, dtype=dtype, quantization="none",
                  kv_cache_dtype="float32" if dtype == "auto" else "auto",
                  kv_cache_memory="64MiB")
        engine = llm.llm_engine.engine_core
        report[dtype] = {
            "dtype": str(engine.dtype).removeprefix("torch."),
            "packed": engine.model.layers[0].qkv.packed is not None,
            "tokens": [o.outputs[0].token_ids for o in llm.generate(prompts, params)],
        }
    report["dtype_auto"] = report["auto"]["dtype"]
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
