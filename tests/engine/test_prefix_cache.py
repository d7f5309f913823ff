"""Prefix caching across requests and turns of a chat."""

from __future__ import annotations

from officellm.engine import SamplingParams
from officellm.engine.llm import apply_chat_template

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def test_second_request_sharing_a_prefix_hits_its_full_blocks(smollm2_llm):
    shared = list(range(1000, 1000 + 75))  # 75 shared tokens -> floor(75/16) = 4 full blocks
    smollm2_llm.generate([shared + [5, 6, 7]], GREEDY)
    out = smollm2_llm.generate([shared + [8, 9]], GREEDY)[0]
    assert out.num_cached_tokens >= (75 // 16) * 16


def test_turn_two_hits_all_full_blocks_of_turn_one_prompt_and_answer(smollm2_llm, smollm2_tokenizer):
    tok = smollm2_tokenizer
    turn1 = [{"role": "user", "content": "Describe the water cycle in a few sentences."}]
    out1 = smollm2_llm.chat(turn1, SamplingParams(temperature=0, max_tokens=60))[0]
    answer = out1.outputs[0]
    turn2 = turn1 + [{"role": "assistant", "content": answer.text},
                     {"role": "user", "content": "And why does it matter for farmers?"}]
    prompt2 = apply_chat_template(tok, turn2)
    turn1_ids = out1.prompt_token_ids + answer.token_ids
    # Turn 2 resends turn 1 verbatim (prompt + answer incl. end-of-turn) as its prefix.
    common = 0
    while common < min(len(turn1_ids), len(prompt2)) and turn1_ids[common] == prompt2[common]:
        common += 1
    assert common >= len(out1.prompt_token_ids) + len(answer.token_ids) - 1
    out2 = smollm2_llm.generate([prompt2], GREEDY)[0]
    # The final token (end of turn) was sampled, never fed back, so its KV was not computed.
    full_blocks = (min(common, len(turn1_ids) - 1) // 16) * 16
    assert out2.num_cached_tokens >= full_blocks > len(out1.prompt_token_ids)


def test_cached_blocks_count_as_free_when_idle(smollm2_llm):
    smollm2_llm.generate([list(range(200, 260))], GREEDY)
    stats = smollm2_llm.llm_engine.stats()
    assert stats.kv_cache_usage == 0.0 and stats.num_blocks_used == 0
    assert stats.num_blocks_cached > 0


def test_cache_salt_isolates_identical_prompts(smollm2_llm):
    engine = smollm2_llm.llm_engine
    prompt = list(range(3000, 3080))

    def run(rid: str, salt: str) -> int:
        engine.add_request(rid, prompt, GREEDY, cache_salt=salt)
        cached = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                cached = out.num_cached_tokens
        return cached or 0

    assert run("alice-1", "alice") == 0
    assert run("bob-1", "bob") == 0
    assert run("alice-2", "alice") >= 64


def test_a_resent_prompt_computes_only_the_tokens_past_its_cached_prefix(smollm2_llm):
    prompt = list(range(31_000, 31_070))  # four full blocks and 6 tokens, sent nowhere else
    params = SamplingParams(temperature=0, max_tokens=1)
    before = smollm2_llm.llm_engine.stats()
    smollm2_llm.generate([prompt], params)
    smollm2_llm.generate([prompt], params)
    after = smollm2_llm.llm_engine.stats()
    computed = after.prompt_tokens_computed_total - before.prompt_tokens_computed_total
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    assert hits == 64
    assert computed == 70 + (70 - 64)
