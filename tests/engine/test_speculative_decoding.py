"""N-gram speculative decoding (`speculative_config`, engine/core/speculation.py): greedy
output with drafts verified equals output without them, and transformers', under batching,
chunked prefill, prefix-cache hits, preemption, n=2, penalties, min_tokens, a grammar in the
batch and tensor parallelism; sampled output keeps its distribution (rejection sampling);
drafts are really made and kept (a test that drafted nothing would prove nothing); no KV
block is left behind."""

from __future__ import annotations

import pytest
import torch

from officellm.engine import LLM, SamplingParams
from officellm.engine.core.ngram_proposer import NgramProposer
from officellm.engine.core.speculative_config import SpeculativeConfig
from tests.engine.conftest import MAX_NEW, make_llm
from tests.support.hf_reference import assert_all_match, compare_greedy_outputs
from tests.support.tiny_models import shared_tiny_model

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
         "prompt_lookup_max": 4}
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=2)
CODE = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
        "def mul(a, b):\n    return a * b\n")
# Replies that repeat their prompt, as an edit of a file does: drafts are kept.
REPEATS = [
    [{"role": "user", "content": "Repeat this code exactly, then stop:\n" + CODE}],
    [{"role": "user", "content": "Copy this list: apple, banana, cherry, date, elderberry, "
                                 "fig, grape, apple, banana, cherry."}],
]
COPY = SamplingParams(temperature=0.0, max_tokens=64, logprobs=2)


def spec_llm(model_dir, **kwargs) -> LLM:
    return make_llm(model_dir, speculative_config=NGRAM, **kwargs)


def drafts(llm: LLM) -> tuple[int, int]:
    """(draft tokens verified, draft tokens kept) since the engine started."""
    stats = llm.llm_engine.stats()
    return stats.spec_decode_num_draft_tokens, stats.spec_decode_num_accepted_tokens


def assert_same(spec_outputs, plain_outputs) -> None:
    for ours, ref in zip(spec_outputs, plain_outputs, strict=True):
        tie = compare_greedy_outputs(ours.outputs[0], ref.outputs[0])
        if tie:
            print("accepted fp32 near-tie:", tie)


@pytest.fixture(scope="module")
def repeat_prompts(smollm2_llm) -> list[list[int]]:
    return [smollm2_llm.apply_chat_template(m) for m in REPEATS]


@pytest.fixture(scope="module")
def plain_repeats(smollm2_llm, repeat_prompts):
    return smollm2_llm.generate(repeat_prompts, COPY)


@pytest.fixture(scope="module")
def speculating(smollm2_dir) -> LLM:
    return spec_llm(smollm2_dir)


# --- the proposer ------------------------------------------------------------------------
def test_drafts_follow_the_latest_earlier_occurrence_of_the_longest_suffix() -> None:
    p = NgramProposer(SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1,
                                        prompt_lookup_max=3))
    # [5, 6] occurs twice before the end; the later occurrence is followed by 8, 9.
    assert p.propose([5, 6, 7, 1, 5, 6, 8, 9, 2, 5, 6], 10) == [8, 9, 2]


def test_no_repeat_no_draft_and_drafts_stop_at_the_room_left() -> None:
    p = NgramProposer(SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=2,
                                        prompt_lookup_max=3))
    assert p.propose([1, 2, 3, 4, 5, 6], 10) == []
    assert p.propose([1, 2, 3, 4, 1, 2], 1) == [3]
    assert p.propose([1, 2, 3, 4, 1, 2], 0) == []


def test_a_config_the_engine_cannot_honour_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="eagle"):
        SpeculativeConfig.parse('{"method": "eagle"}')
    with pytest.raises(ValueError, match="draft_model"):
        SpeculativeConfig.parse({"method": "ngram", "draft_model": "x"})
    with pytest.raises(ValueError, match="not JSON"):
        SpeculativeConfig.parse("{ngram")


# --- output equals output without drafts -------------------------------------------------
def test_greedy_copying_with_drafts_equals_without_and_drafts_are_kept(
        speculating, repeat_prompts, plain_repeats) -> None:
    before = drafts(speculating)
    outputs = speculating.generate(repeat_prompts, COPY)
    assert_same(outputs, plain_repeats)
    drafted, kept = (a - b for a, b in zip(drafts(speculating), before, strict=True))
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert kept > 0.25 * tokens, (drafted, kept, tokens)  # a quarter came in free
    assert speculating.llm_engine.stats().num_blocks_used == 0


def test_chats_with_drafts_equal_transformers(speculating, chat_prompt_ids, smollm2_refs):
    before = drafts(speculating)
    assert_all_match(speculating.generate(chat_prompt_ids, GREEDY), smollm2_refs)
    assert drafts(speculating)[0] > before[0], "no chat drafted: the test proves nothing"


@pytest.mark.slow  # CI budget: docs/testing.md
def test_chunked_prefill_with_drafts_equals_transformers(smollm2_dir, chat_prompt_ids,
                                                         smollm2_refs) -> None:
    llm = spec_llm(smollm2_dir, max_num_batched_tokens=16)
    assert_all_match(llm.generate(chat_prompt_ids, GREEDY), smollm2_refs)
    assert drafts(llm)[0] > 0


@pytest.mark.slow  # CI budget: docs/testing.md
def test_prefix_cache_hits_with_drafts_give_the_same_output(speculating, repeat_prompts,
                                                             plain_repeats) -> None:
    speculating.generate(repeat_prompts, COPY)
    hits = speculating.llm_engine.stats().prefix_cache_hits
    again = speculating.generate(repeat_prompts, COPY)
    assert speculating.llm_engine.stats().prefix_cache_hits > hits
    assert_same(again, plain_repeats)


def test_preemption_with_drafts_equals_transformers(smollm2_dir, chat_prompt_ids,
                                                    smollm2_refs) -> None:
    pool = 24 * 16 * 46080  # 24 blocks: 8 chats cannot all stay resident
    llm = spec_llm(smollm2_dir, kv_cache_memory=pool, enable_prefix_caching=False)
    assert_all_match(llm.generate(chat_prompt_ids, GREEDY), smollm2_refs)
    stats = llm.llm_engine.stats()
    assert stats.num_preemptions_total > 0 and stats.spec_decode_num_draft_tokens > 0
    assert stats.num_blocks_used == 0


@pytest.mark.slow  # CI budget: docs/testing.md
def test_two_greedy_sequences_each_draft_and_equal_the_plain_ones(
        speculating, smollm2_llm, repeat_prompts) -> None:
    two = SamplingParams(temperature=0.0, max_tokens=48, n=2, logprobs=2)
    ours = speculating.generate(repeat_prompts[:1], two)[0]
    plain = smollm2_llm.generate(repeat_prompts[:1], two)[0]
    for a, b in zip(ours.outputs, plain.outputs, strict=True):
        compare_greedy_outputs(a, b)


@pytest.mark.parametrize("params", [
    pytest.param(SamplingParams(temperature=0.0, max_tokens=48, presence_penalty=0.8,
                                frequency_penalty=0.3, logprobs=2), marks=pytest.mark.slow),
    pytest.param(SamplingParams(temperature=0.0, max_tokens=48, repetition_penalty=1.05,
                                logprobs=2), marks=pytest.mark.slow),
    SamplingParams(temperature=0.0, max_tokens=48, min_tokens=40, logprobs=2),
], ids=["presence-frequency", "repetition", "min-tokens"])
def test_penalties_and_min_tokens_see_each_drafts_predecessors(
        speculating, smollm2_llm, repeat_prompts, params) -> None:
    before = drafts(speculating)[0]
    assert_same(speculating.generate(repeat_prompts, params),
                smollm2_llm.generate(repeat_prompts, params))
    assert drafts(speculating)[0] > before


@pytest.mark.slow  # CI budget: docs/testing.md
def test_a_stop_string_inside_kept_drafts_ends_the_text_there(speculating, smollm2_llm,
                                                              repeat_prompts) -> None:
    stop = SamplingParams(temperature=0.0, max_tokens=64, stop=["return a - b"])
    ours = speculating.generate(repeat_prompts[:1], stop)[0].outputs[0]
    plain = smollm2_llm.generate(repeat_prompts[:1], stop)[0].outputs[0]
    assert (ours.text, ours.finish_reason) == (plain.text, plain.finish_reason)


def test_a_tiny_random_model_with_drafts_equals_itself_without(tmp_path_factory,
                                                               smollm2_dir) -> None:
    tiny = shared_tiny_model("qwen2", tmp_path_factory, smollm2_dir)
    prompts = [[5, 6, 7, 8, 9] * 6, list(range(100, 140))]
    params = SamplingParams(temperature=0.0, max_tokens=40, logprobs=2, ignore_eos=True)
    plain = make_llm(tiny).generate(prompts, params)
    llm = spec_llm(tiny)
    assert_same(llm.generate(prompts, params), plain)
    assert drafts(llm)[1] > 0
    assert llm.llm_engine.stats().num_blocks_used == 0


def test_rejection_sampling_against_a_draft_keeps_the_rows_distribution() -> None:
    """A sampled row verified against a draft d keeps d with probability p(d), else draws
    from p without d: its token is distributed as p itself. 20,000 draws against a draft
    of probability 0.3; each token's share within 0.015 of its probability (more than 4
    standard errors: a correct sampler fails this about once in 10^4 runs; seeded, it
    gives the same draws every run)."""
    from officellm.engine.core.request import Request
    from officellm.engine.worker.sampler import Sampler
    from officellm.engine.worker.sampling_metadata import SamplingMetadata, SamplingRow

    probs = torch.tensor([0.3, 0.45, 0.2, 0.05])
    logits = probs.log().unsqueeze(0).repeat(20_000, 1)
    rows = []
    for i in range(20_000):
        req = Request(f"r{i}", [1], SamplingParams(temperature=1.0, seed=i))
        rows.append(SamplingRow.with_drafts(req, (0,))[0])  # verified against draft 0
    tokens = Sampler(seed=0)(logits, SamplingMetadata(rows)).token_ids
    shares = torch.bincount(torch.tensor(tokens), minlength=4).float() / len(tokens)
    assert torch.allclose(shares, probs, atol=0.015), shares


@pytest.mark.slow  # CI budget: docs/testing.md
def test_sampled_output_with_drafts_is_distributed_as_without(tmp_path_factory,
                                                              smollm2_dir) -> None:
    """On a tiny model that tends to repeat its last token (temperature 0.3), drafts of
    that token (from the third token on: the first repeat is the first match) are often
    kept and sometimes rejected; the share of replies whose third and fourth tokens repeat
    the one before, the quantities drafting could bias, is the same with and without drafts
    within 4 standard errors of the difference (1,000 seeded replies each)."""
    tiny = shared_tiny_model("qwen2", tmp_path_factory, smollm2_dir)
    prompt = [5, 6, 7, 8, 9] * 6
    n = 1000

    def repeats(llm: LLM, seed0: int) -> list[float]:
        params = [SamplingParams(temperature=0.3, max_tokens=4, ignore_eos=True, seed=seed0 + i)
                  for i in range(n)]
        outs = [o.outputs[0].token_ids for o in llm.generate([prompt] * n, params)]
        return [sum(t[i] == t[i - 1] for t in outs) / n for i in (2, 3)]

    plain = repeats(make_llm(tiny, kv_cache_memory="64MiB"), 0)
    llm = make_llm(tiny, kv_cache_memory="64MiB", speculative_config={
        "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1})
    drafted = repeats(llm, n)
    made, kept = drafts(llm)
    assert 0 < kept < made, (made, kept)  # drafts were both kept and rejected
    for a, b in zip(plain, drafted, strict=True):
        se = (a * (1 - a) / n + b * (1 - b) / n) ** 0.5
        assert abs(b - a) < 4 * se, (plain, drafted, se)



def test_each_verification_row_sees_the_drafts_before_it_as_output() -> None:
    """What penalties and min_tokens read at the row after the i-th draft is the sequence
    as it would stand had the drafts before it been accepted (the whole-model tests above
    rarely meet a draft that a penalty would flip)."""
    from officellm.engine.core.request import Request
    from officellm.engine.worker.sampling_metadata import SamplingRow

    req = Request("r", [1, 2, 3], SamplingParams(temperature=0.0, presence_penalty=1.0))
    req.append_output_token(4)
    rows = SamplingRow.with_drafts(req, (5, 6))
    assert [r.output_token_ids for r in rows] == [[4], [4, 5], [4, 5, 6]]
    assert [r.all_token_ids for r in rows] == [[1, 2, 3, 4], [1, 2, 3, 4, 5],
                                               [1, 2, 3, 4, 5, 6]]
    assert [r.num_output_tokens for r in rows] == [1, 2, 3]  # min_tokens counts them too


@pytest.mark.slow  # CI budget: docs/testing.md
def test_two_tensor_parallel_ranks_with_drafts_give_the_tokens_of_one_without(
        tmp_path_factory, smollm2_dir) -> None:
    tiny = shared_tiny_model("qwen2", tmp_path_factory, smollm2_dir)
    prompts = [[5, 6, 7, 8, 9] * 6, list(range(100, 140))]
    params = SamplingParams(temperature=0.0, max_tokens=32, logprobs=2, ignore_eos=True)
    plain = make_llm(tiny, kv_cache_memory="8MiB").generate(prompts, params)
    with spec_llm(tiny, kv_cache_memory="8MiB", tensor_parallel_size=2) as tp2:
        assert_same(tp2.generate(prompts, params), plain)
        assert drafts(tp2)[1] > 0


def test_a_grammar_request_batched_after_drafting_ones_keeps_its_mask_rows(
        speculating, smollm2_llm, repeat_prompts) -> None:
    """A decode with drafts has a logits row per position: a grammar request sampling after
    it in the batch (its prompt's last chunk comes after the decodes) must still get its own
    bitmask row. It arrives once the others draft."""
    import re

    from officellm.engine.structured_output import StructuredOutputsParams

    pattern = r"[a-z]{3,8}-[0-9]{2}"
    constrained = SamplingParams(temperature=0, max_tokens=24,
                                 structured_outputs=StructuredOutputsParams(regex=pattern))
    engine = speculating.llm_engine
    for i, ids in enumerate(repeat_prompts):
        engine.add_request(f"copy-{i}", ids, COPY)
    running = engine.engine_core.scheduler.running
    texts: dict[str, str] = {}
    added = False
    while engine.has_unfinished_requests():
        if not added and any(r.draft_token_ids for r in running):
            # The next step verifies drafts, and prefills this prompt after them.
            engine.add_request("grammar", smollm2_llm.apply_chat_template(
                [{"role": "user", "content": "Give a code like abc-12."}]), constrained)
            added = True
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + "".join(
                c.text for c in out.outputs)
    assert added, "nothing drafted: the test proves nothing"
    plain = smollm2_llm.generate([smollm2_llm.apply_chat_template(
        [{"role": "user", "content": "Give a code like abc-12."}])], constrained)[0]
    assert re.fullmatch(pattern, texts["grammar"])
    assert texts["grammar"] == plain.outputs[0].text


def test_the_proposer_finds_what_a_plain_search_finds() -> None:
    """The proposer's one-pass search (occurrences of the last token, then how far back
    each matches) against the obvious search, on 2,000 seeded random short sequences over
    a 4-token vocabulary (many repeats)."""
    import random

    def plain_search(tokens: list[int], lo: int, hi: int, k: int) -> list[int]:
        for n in range(min(hi, len(tokens) - 1), lo - 1, -1):
            for i in range(len(tokens) - n - 1, -1, -1):
                if tokens[i:i + n] == tokens[-n:]:
                    return tokens[i + n:i + n + k]
        return []

    proposer = NgramProposer(SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=2,
                                               prompt_lookup_max=4))
    rng = random.Random(0)
    for _ in range(2000):
        tokens = [rng.randrange(4) for _ in range(rng.randint(1, 40))]
        room = rng.randint(0, 5)
        assert proposer.propose(tokens, room) == plain_search(tokens, 2, 4, min(4, room)), tokens
