"""Sampling: seeds, top-k/p, stop strings and ids, logprobs, min/max tokens, n > 1."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from officellm.engine import SamplingParams
from tests.support.hf_reference import hf_greedy

PROMPT = "The three most useful things to keep on an office desk are"


def _tokens(llm, prompts, params):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_seeded_request_gives_the_same_tokens_alone_and_in_a_batch(smollm2_llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=24)
    alone = _tokens(smollm2_llm, [PROMPT], seeded)[0]
    others = SamplingParams(temperature=1.2, max_tokens=30)
    batch = smollm2_llm.generate(["Once upon a time", PROMPT, "Dear colleagues,"],
                                 [others, seeded, others])
    assert batch[1].outputs[0].token_ids == alone


def test_different_seeds_give_different_samples(smollm2_llm):
    a = _tokens(smollm2_llm, [PROMPT], SamplingParams(temperature=1.0, seed=1, max_tokens=24))
    b = _tokens(smollm2_llm, [PROMPT], SamplingParams(temperature=1.0, seed=2, max_tokens=24))
    assert a != b


def test_top_k_one_is_greedy(smollm2_llm):
    greedy = _tokens(smollm2_llm, [PROMPT], SamplingParams(temperature=0, max_tokens=24))
    top1 = _tokens(smollm2_llm, [PROMPT], SamplingParams(temperature=0.8, top_k=1, max_tokens=24))
    assert greedy == top1


def test_tiny_top_p_is_greedy(smollm2_llm):
    greedy = _tokens(smollm2_llm, [PROMPT], SamplingParams(temperature=0, max_tokens=16))
    nucleus = _tokens(smollm2_llm, [PROMPT], SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=16))
    assert greedy == nucleus


def test_stop_string_ends_with_stop_and_is_cut_from_the_text(smollm2_llm):
    full = smollm2_llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=40))[0].outputs[0]
    words = full.text.split()
    stop = words[3]
    out = smollm2_llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=40, stop=[stop]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert stop not in out.text
    assert full.text.startswith(out.text)
    assert out.text == full.text[: full.text.index(stop)]


def test_stop_token_id_ends_with_stop(smollm2_llm):
    full = smollm2_llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=30))[0].outputs[0]
    stop_id = full.token_ids[5]
    out = smollm2_llm.generate(
        [PROMPT], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_id]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    assert out.token_ids == full.token_ids[: full.token_ids.index(stop_id) + 1]


def test_max_tokens_ends_with_length(smollm2_llm):
    out = smollm2_llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=7, ignore_eos=True))[0]
    assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 7


def test_min_tokens_suppresses_eos(smollm2_llm):
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    short = smollm2_llm.chat(chat, SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]
    assert short.finish_reason == "stop"
    n = len(short.token_ids) + 5
    longer = smollm2_llm.chat(chat, SamplingParams(temperature=0, max_tokens=64, min_tokens=n))[0].outputs[0]
    assert len(longer.token_ids) >= n
    assert 2 not in longer.token_ids[: n - 1]


def test_ignore_eos_runs_to_max_tokens(smollm2_llm):
    chat = [{"role": "user", "content": "Say yes."}]
    out = smollm2_llm.chat(chat, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 40 and out.finish_reason == "length"


def test_logprobs_equal_log_softmax_of_transformers_logits(smollm2_llm, smollm2_hf, smollm2_tokenizer):
    ids = smollm2_tokenizer.encode(PROMPT)
    out = smollm2_llm.generate([ids], SamplingParams(temperature=0, max_tokens=8, logprobs=5,
                                                     ignore_eos=True))[0].outputs[0]
    ref = hf_greedy(smollm2_hf, ids, 8, ignore_eos=True)
    assert out.token_ids == ref.token_ids
    for pos, (tok, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        hf_lp = ref.logprobs[pos]
        assert entry[tok].rank == 1
        assert abs(entry[tok].logprob - float(hf_lp[tok])) < 1e-4
        top5 = hf_lp.topk(5)
        for lp, t in zip(top5.values.tolist(), top5.indices.tolist()):
            assert abs(entry[t].logprob - lp) < 1e-4


def test_n_sequences_share_the_prompt_blocks(smollm2_llm):
    prompt = list(range(5000, 5000 + 64))  # 4 full blocks
    engine = smollm2_llm.llm_engine
    hits_before = engine.stats().prefix_cache_hits
    out = smollm2_llm.generate([prompt], SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12))[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    # Sequences 1 and 2 reuse the first sequence's prompt blocks (all but the last token's).
    assert engine.stats().prefix_cache_hits - hits_before >= 2 * 48


def test_repetition_penalty_changes_greedy_output(smollm2_llm):
    base = _tokens(smollm2_llm, [PROMPT], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    pen = _tokens(smollm2_llm, [PROMPT], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                                        repetition_penalty=1.5))[0]
    assert base != pen
    assert len(set(pen)) >= len(set(base))


def _most_repeated(tokens: list[int]) -> int:
    """How many times the most frequent token occurs (what a frequency penalty, growing with
    each occurrence, holds down)."""
    return max(Counter(tokens).values())


def test_frequency_penalty_reduces_repeats(smollm2_llm):
    base = _tokens(smollm2_llm, [PROMPT], SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))[0]
    pen = _tokens(smollm2_llm, [PROMPT], SamplingParams(temperature=0, max_tokens=48, ignore_eos=True,
                                                        frequency_penalty=2.0))[0]
    assert _most_repeated(base) > 2  # else there is nothing to reduce
    assert _most_repeated(pen) < _most_repeated(base)


@pytest.mark.parametrize("frequency, presence", [(0.7, 0.0), (0.0, 1.3), (2.0, 1.0), (-0.5, 0.25)])
def test_frequency_and_presence_penalties_follow_openais_formula(frequency, presence):
    """OpenAI: logit[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty, with c[j]
    the count of j among the tokens generated so far (the prompt's tokens do not count)."""
    from officellm.engine.core.request import Request
    from officellm.engine.worker.sampler import Sampler
    from officellm.engine.worker.sampling_metadata import SamplingMetadata

    params = SamplingParams(frequency_penalty=frequency, presence_penalty=presence)
    req = Request("r", [0, 1, 1, 5], params, eos_token_ids=frozenset())
    for token in (2, 3, 3, 3, 5):
        req.append_output_token(token)
    logits = torch.linspace(-3.0, 4.0, 8).unsqueeze(0)
    counts = torch.tensor([0, 0, 1, 3, 0, 1, 0, 0], dtype=torch.float32)
    expected = logits[0] - counts * frequency - (counts > 0).float() * presence
    out = Sampler._apply_penalties(logits, SamplingMetadata.from_requests([req]).rows)
    torch.testing.assert_close(out[0], expected, rtol=0, atol=1e-6)
    assert torch.equal(logits, torch.linspace(-3.0, 4.0, 8).unsqueeze(0))  # input untouched


class _RefuseMixedDevices(TorchDispatchMode):
    """CUDA's rule on any device: an op may not mix tensors of two devices (a 0-dim host
    tensor, a scalar, excepted). The meta device, which is lenient, stands in for a GPU."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        tensors = [a for a in pytree.tree_leaves((args, kwargs or {}))
                   if isinstance(a, torch.Tensor) and not (a.device.type == "cpu" and a.dim() == 0)]
        devices = {t.device.type for t in tensors}
        if len(devices) > 1:
            raise RuntimeError(f"{func} mixes devices {sorted(devices)}")
        return func(*args, **(kwargs or {}))


def test_penalties_are_built_on_the_logits_device():
    """On a GPU the logits are on the device: the penalties' counts and indices must be too
    (they were built on the host, and every request with a penalty failed on CUDA)."""
    from officellm.engine.core.request import Request
    from officellm.engine.worker.sampler import Sampler
    from officellm.engine.worker.sampling_metadata import SamplingMetadata

    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.5, repetition_penalty=1.2)
    req = Request("r", [0, 1, 1, 5, 99], params, eos_token_ids=frozenset())  # 99: past vocab
    for token in (2, 3, 3):
        req.append_output_token(token)
    rows = SamplingMetadata.from_requests([req]).rows
    logits = torch.zeros(1, 8, device="meta")
    with _RefuseMixedDevices():
        out = Sampler._apply_penalties(logits, rows)
    assert out.device.type == "meta" and out.shape == (1, 8)


class _CountDeviceReads(TorchDispatchMode):
    """The meta device stands in for a GPU the host would have to wait for: each copy of a
    meta tensor to the host, or read of one of its values, is such a wait. Counted, and
    answered with zeros (a meta tensor holds no values)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if src is not None and src.device.type == "meta":
            if func is torch.ops.aten._local_scalar_dense.default:
                self.reads.append(str(func))
                return False if src.dtype == torch.bool else 0
            if func is torch.ops.aten._to_copy.default and \
                    torch.device(kwargs.get("device", "meta")).type == "cpu":
                self.reads.append(str(func))
                return torch.zeros(src.shape, dtype=kwargs.get("dtype") or src.dtype)
        return func(*args, **kwargs)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.8, top_k=20, top_p=0.9),
    SamplingParams(temperature=1.0, seed=3),
], ids=["greedy", "top-k-top-p", "seeded"])
def test_the_sampler_waits_for_the_device_once_a_step(params):
    """On a GPU every host read of a device value waits for the whole step's kernels: the
    common paths read the device once, the sampled tokens (the NaN rows come with them)."""
    from officellm.engine.core.request import Request
    from officellm.engine.worker.sampler import Sampler
    from officellm.engine.worker.sampling_metadata import SamplingMetadata

    requests = [Request(f"r{i}", [1, 2, 3], params, eos_token_ids=frozenset()) for i in range(3)]
    logits = torch.zeros(3, 50, device="meta")
    with _CountDeviceReads() as mode:
        out = Sampler()(logits, SamplingMetadata.from_requests(requests))
    assert mode.reads == ["aten._to_copy.default"]
    assert out.token_ids == [0, 0, 0] and out.invalid == [False, False, False]


@pytest.mark.parametrize("bad", [
    {"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"max_tokens": 0}, {"n": 0},
    {"logprobs": 21}, {"min_tokens": 5, "max_tokens": 2}, {"repetition_penalty": 0.0},
])
def test_invalid_sampling_params_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_sampler_top_p_keeps_the_smallest_set_reaching_p():
    from officellm.engine.worker.sampler import Sampler

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    params = [SamplingParams(top_p=0.8)]
    out = Sampler._top_k_top_p(logits.clone(), params)
    assert torch.isfinite(out[0, :2]).all() and torch.isinf(out[0, 2:]).all()


def _sample_many(params: SamplingParams, probs: list[float], draws: int) -> torch.Tensor:
    """Token counts of `draws` samples from one row of logits log(probs)."""
    from officellm.engine.core.request import Request
    from officellm.engine.worker.sampler import Sampler
    from officellm.engine.worker.sampling_metadata import SamplingMetadata

    sampler = Sampler(seed=1)
    logits = torch.log(torch.tensor([probs] * draws, dtype=torch.float32))
    requests = [Request(f"r{i}", [1], params, eos_token_ids=frozenset()) for i in range(draws)]
    tokens = sampler(logits, SamplingMetadata.from_requests(requests)).token_ids
    return torch.bincount(torch.tensor(tokens), minlength=len(probs))


def test_temperature_sampling_follows_the_distribution():
    probs = [0.5, 0.3, 0.15, 0.05, 0.0]
    counts = _sample_many(SamplingParams(temperature=1.0), probs, 20000)
    freq = counts.float() / counts.sum()
    # 20,000 draws: 4 standard deviations of the largest share is under 0.015.
    assert torch.allclose(freq, torch.tensor(probs), atol=0.015)
    assert counts[4] == 0  # a token of zero probability is never drawn


def test_top_k_never_draws_outside_the_k_best():
    counts = _sample_many(SamplingParams(temperature=1.0, top_k=2), [0.4, 0.35, 0.2, 0.05], 5000)
    assert counts[2] == 0 and counts[3] == 0 and counts[0] > counts[1] > 0


def test_a_temperature_that_overflows_the_logits_still_samples_a_valid_token():
    """logits / 1e-40 is inf in float32: no distribution to sample; the most likely token."""
    counts = _sample_many(SamplingParams(temperature=1e-40), [0.1, 0.7, 0.2], 50)
    assert counts.tolist() == [0, 50, 0]
