"""The yardstick: Hugging Face transformers' greedy generate on the same weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

# vLLM's rule for a genuine fp32 near-tie: both tokens in each other's top-2 with
# log-probabilities within this much. Never loosen it.
TIE_TOLERANCE = 1e-4


@dataclass
class HFGreedy:
    token_ids: list[int]
    logprobs: list[torch.Tensor]  # per generated position: log_softmax of the logits [V]


def load_hf_model(model_dir: Path, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    model.eval()
    return model


@torch.inference_mode()
def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int] | None = None,
              ignore_eos: bool = False) -> HFGreedy:
    """One prompt at a time (no padding), do_sample=False, with per-step logits."""
    kwargs = {}
    if ignore_eos:
        kwargs["eos_token_id"] = None
        kwargs["min_new_tokens"] = max_new_tokens
    elif eos_ids is not None:
        kwargs["eos_token_id"] = sorted(eos_ids)
    out = model.generate(
        torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        do_sample=False, max_new_tokens=max_new_tokens, output_logits=True,
        return_dict_in_generate=True, pad_token_id=model.config.pad_token_id or 0,
        temperature=None, top_p=None, top_k=None, **kwargs,
    )
    gen = out.sequences[0, len(prompt_ids):].tolist()
    lps = [torch.log_softmax(step[0].float(), dim=-1) for step in out.logits]
    return HFGreedy(gen, lps[: len(gen)])


def compare_greedy(ours_ids: list[int], ours_logprobs, ref: HFGreedy) -> str | None:
    """Assert the engine's greedy tokens equal transformers'; allow only a genuine near-tie.

    Returns a report of an accepted near-tie divergence (None when identical). `ours_logprobs`
    is the engine's per-token logprobs dicts (requested with logprobs>=2).
    """
    for i, (a, b) in enumerate(zip(ours_ids, ref.token_ids)):
        if a == b:
            continue
        ref_lp = ref.logprobs[i]
        ref_top2 = ref_lp.topk(2).indices.tolist()
        ours = ours_logprobs[i] if ours_logprobs else {}
        ours_top2 = sorted(ours, key=lambda t: -ours[t].logprob)[:2]
        near_tie = (
            a in ref_top2 and b in ref_top2 and a in ours_top2 and b in ours_top2
            and abs(float(ref_lp[a] - ref_lp[b])) <= TIE_TOLERANCE
            and abs(ours[a].logprob - ours[b].logprob) <= TIE_TOLERANCE
        )
        assert near_tie, (
            f"greedy divergence at generated position {i}: engine {a}, transformers {b} "
            f"(transformers logprobs {float(ref_lp[a]):.6f} vs {float(ref_lp[b]):.6f})\n"
            f"engine: {ours_ids}\ntransformers: {ref.token_ids}")
        return f"near-tie at position {i}: engine {a} vs transformers {b}"
    assert len(ours_ids) == len(ref.token_ids), (
        f"length differs: engine {len(ours_ids)} tokens, transformers {len(ref.token_ids)}\n"
        f"engine: {ours_ids}\ntransformers: {ref.token_ids}")
    return None
