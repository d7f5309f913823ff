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
        return_dict_in_generate=True, pad_token_id=model.config.get_text_config().pad_token_id or 0,
        temperature=None, top_p=None, top_k=None, **kwargs,
    )
    gen = out.sequences[0, len(prompt_ids):].tolist()
    lps = [torch.log_softmax(step[0].float(), dim=-1) for step in out.logits]
    return HFGreedy(gen, lps[: len(gen)])


def _near_tie(a: int, b: int, lps_x: dict[int, float], lps_y: dict[int, float]) -> bool:
    """Both tokens in each side's top-2 log-probabilities, within TIE_TOLERANCE on both."""
    return all(a in lps and b in lps and abs(lps[a] - lps[b]) <= TIE_TOLERANCE
               for lps in (lps_x, lps_y))


def _engine_top2(logprobs: dict) -> dict[int, float]:
    top = sorted(logprobs, key=lambda t: -logprobs[t].logprob)[:2]
    return {t: logprobs[t].logprob for t in top}


def compare_greedy(ours_ids: list[int], ours_logprobs, ref: HFGreedy) -> str | None:
    """Assert the engine's greedy tokens equal transformers'; allow only a genuine near-tie.

    Returns a report of an accepted near-tie divergence (None when identical). `ours_logprobs`
    is the engine's per-token logprobs dicts (requested with logprobs>=2).
    """
    for i, (a, b) in enumerate(zip(ours_ids, ref.token_ids)):
        if a == b:
            continue
        ref_lp = ref.logprobs[i]
        top = ref_lp.topk(2)
        ref_top2 = dict(zip(top.indices.tolist(), top.values.tolist()))
        ours_top2 = _engine_top2(ours_logprobs[i]) if ours_logprobs else {}
        assert _near_tie(a, b, ref_top2, ours_top2), (
            f"greedy divergence at generated position {i}: engine {a}, transformers {b} "
            f"(transformers logprobs {float(ref_lp[a]):.6f} vs {float(ref_lp[b]):.6f})\n"
            f"engine: {ours_ids}\ntransformers: {ref.token_ids}")
        return f"near-tie at position {i}: engine {a} vs transformers {b}"
    assert len(ours_ids) == len(ref.token_ids), (
        f"length differs: engine {len(ours_ids)} tokens, transformers {len(ref.token_ids)}\n"
        f"engine: {ours_ids}\ntransformers: {ref.token_ids}")
    return None


def compare_greedy_outputs(ours, ref) -> str | None:
    """compare_greedy between two engine runs (CompletionOutputs with logprobs>=2), e.g.
    tensor parallel against one process: the same near-tie rule, both sides' logprobs."""
    for i, (a, b) in enumerate(zip(ours.token_ids, ref.token_ids)):
        if a == b:
            continue
        assert _near_tie(a, b, _engine_top2(ours.logprobs[i]), _engine_top2(ref.logprobs[i])), (
            f"greedy divergence at generated position {i}: {a} vs reference {b}\n"
            f"ours: {ours.token_ids}\nreference: {ref.token_ids}")
        return f"near-tie at position {i}: {a} vs reference {b}"
    assert ours.token_ids == ref.token_ids, (
        f"length differs\nours: {ours.token_ids}\nreference: {ref.token_ids}")
    return None


def assert_all_match(outputs, refs) -> list[str]:
    """Each output's greedy tokens equal its reference's, but for reported fp32 near-ties
    (returned, and printed)."""
    ties = []
    for i, (out, ref) in enumerate(zip(outputs, refs)):
        o = out.outputs[0]
        report = compare_greedy(o.token_ids, o.logprobs, ref)
        if report:
            ties.append(f"prompt {i}: {report}")
    if ties:
        print("accepted fp32 near-ties:", *ties, sep="\n  ")
    return ties
