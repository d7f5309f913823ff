"""(b) Engine greedy output vs transformers on the same random Qwen2.5-0.5B-shaped weights.

fp32 must be identical token for token; bf16 reports agreement and the first position where
the two diverge (rounding differences compound, so divergence is expected eventually).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from benchmarks.gpucheck.models import (
    build_engine,
    free_cuda,
    hf_config,
    random_hf_model,
    random_prompts,
    write_model_dir,
)


@torch.inference_mode()
def _hf_greedy(model, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    outs = []
    for p in prompts:  # one at a time: no padding, the plainest reference
        ids = torch.tensor([p], device=model.device)
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new, pad_token_id=0, temperature=None,
                             top_p=None, top_k=None)
        outs.append(gen[0, len(p):].tolist())
    return outs


def _engine_greedy(engine, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    from officellm.engine.frontend.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_new, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", p, params)
    tokens: dict[str, list[int]] = {f"p{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.error:
                raise RuntimeError(f"engine request {out.request_id} failed: {out.error}")
            tokens[out.request_id].extend(out.outputs[0].token_ids)
    return [tokens[f"p{i}"] for i in range(len(prompts))]


def _compare(ours: list[list[int]], ref: list[list[int]]) -> dict:
    firsts, agree, total = [], 0, 0
    for a, b in zip(ours, ref):
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        firsts.append(first)
        agree += sum(x == y for x, y in zip(a, b))
        total += len(b)
    return {"identical": all(f is None for f in firsts), "agreement": agree / max(1, total),
            "first_divergence": firsts}


def run(device: torch.device, smoke: bool) -> dict:
    t0 = time.perf_counter()
    cfg = hf_config("Qwen2.5-0.5B-Instruct", smoke)
    n, plen, max_new = (3, 20, 8) if smoke else (8, 100, 64)
    prompts = random_prompts(n, plen, cfg.vocab_size, seed=1)
    report: dict = {"model": "Qwen2.5-0.5B-shaped, random weights", "prompts": n,
                    "prompt_tokens": plen, "new_tokens": max_new}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(cfg, Path(tmp) / "qwen-0.5b")
        hf32 = random_hf_model(cfg, torch.float32, device)
        # No EOS on either side (the engine ignores it): both generate exactly max_new tokens.
        hf32.generation_config.eos_token_id = None
        for dtype in (torch.float32, torch.bfloat16):
            # Module.to casts in place: after the fp32 round, the bf16 model is the same object.
            hf = hf32.to(dtype)
            ref = _hf_greedy(hf, prompts, max_new)
            engine = build_engine(hf32, model_dir, device=device.type,
                                  dtype=str(dtype).removeprefix("torch."),
                                  kv_cache_memory="2GiB", max_model_len=1024, max_num_seqs=16)
            ours = _engine_greedy(engine, prompts, max_new)
            report[str(dtype).removeprefix("torch.")] = {
                **_compare(ours, ref), "backend": engine.engine_core.backend,
                "cuda_graphs": engine.engine_core.runner.decode_graphs is not None}
            del engine, hf
            free_cuda()
        del hf32
    free_cuda()
    report["seconds"] = time.perf_counter() - t0
    report["ok"] = report["float32"]["identical"]
    return report
