"""A fault in one request fails that request alone; the engine and the others go on.

The fault is real: the poisoned model's embedding of POISON is NaN, so a prompt holding
it writes NaN keys/values into the KV cache and gets NaN logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from officellm.engine import SamplingParams
from tests.engine.conftest import POISON, make_llm

PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
HEALTHY = [10, 11, 12, 13]
# Longer than one block (16 tokens), so the failed request fills a block the prefix cache
# would otherwise keep; POISON early, so every later position of that block is NaN too.
POISONED = [10, POISON] + list(range(30, 48))


@dataclass
class Result:
    token_ids: list[int] = field(default_factory=list)
    error: str | None = None
    finish_reason: str | None = None


def run(engine, prompts: dict[str, list[int]]) -> dict[str, Result]:
    """Add every prompt, step the engine until all finish, and collect each request's end."""
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, PARAMS)
    results = {rid: Result() for rid in prompts}
    for _ in range(100):  # bounded: a request that never ends fails the test, not hangs it
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            res = results[out.request_id]
            res.token_ids += out.outputs[0].token_ids
            res.error = res.error or out.error
            if out.finished:
                res.finish_reason = out.outputs[0].finish_reason
    assert not engine.has_unfinished_requests(), "the engine never finished these requests"
    return results


def alone(model_dir, rid: str, prompt: list[int]) -> Result:
    """What a request produces on a fresh engine that never saw a fault."""
    return run(make_llm(model_dir, kv_cache_memory="8MiB").llm_engine, {rid: prompt})[rid]


def kv_has_nan(runner) -> bool:
    return any(torch.isnan(c).any().item() for c in runner.k_caches + runner.v_caches)


@pytest.fixture
def engine(poisoned_model):
    return make_llm(poisoned_model, kv_cache_memory="8MiB").llm_engine


@pytest.fixture
def scrub_log(engine) -> list[dict]:
    """Each scrub: the blocks it named, whether they held NaN before, and all-zero after."""
    log: list[dict] = []
    runner, original = engine.engine_core.runner, engine.engine_core.runner.scrub_blocks

    def blocks_of(ids: list[int]) -> list[torch.Tensor]:
        idx = torch.tensor(ids, dtype=torch.long)
        return [c.index_select(0, idx) for c in runner.k_caches + runner.v_caches]

    def scrub(ids: list[int]) -> None:
        had_nan = any(torch.isnan(b).any().item() for b in blocks_of(ids))
        original(ids)
        log.append({"ids": list(ids), "had_nan": had_nan,
                    "zero_after": all(not b.any().item() for b in blocks_of(ids))})

    runner.scrub_blocks = scrub  # an instance attribute: only this engine is watched
    return log


def test_nan_logits_fail_only_that_request(engine):
    results = run(engine, {"healthy": HEALTHY, "poisoned": POISONED})
    assert "NaN" in (results["poisoned"].error or "")
    assert results["poisoned"].finish_reason == "error"
    assert results["poisoned"].token_ids == []  # its first sample was already NaN
    assert results["healthy"].error is None
    assert results["healthy"].finish_reason == "length"


def test_the_other_request_of_the_batch_is_unaffected(engine, poisoned_model):
    together = run(engine, {"healthy": HEALTHY, "poisoned": POISONED})["healthy"]
    assert together == alone(poisoned_model, "healthy", HEALTHY)
    assert len(together.token_ids) == PARAMS.max_tokens


def test_the_failed_requests_blocks_are_freed_and_scrubbed(engine, scrub_log):
    run(engine, {"healthy": HEALTHY, "poisoned": POISONED})
    assert engine.stats().num_blocks_used == 0
    # The poison did reach the KV cache (else this test proves nothing), and the blocks the
    # failed request wrote were zeroed: no NaN is left anywhere for a later reader.
    assert [s["had_nan"] for s in scrub_log] == [True]
    assert scrub_log[0]["zero_after"]
    assert len(scrub_log[0]["ids"]) == -(-len(POISONED) // 16)
    assert not kv_has_nan(engine.engine_core.runner)


def test_a_failed_request_leaves_nothing_in_the_prefix_cache(engine, scrub_log):
    """Its full block was hashed while it ran; had the hash stayed, the same prompt would
    read the scrubbed (zero) block and "succeed" with garbage instead of failing again."""
    first = run(engine, {"poisoned": POISONED})["poisoned"]
    again = run(engine, {"poisoned-again": POISONED})["poisoned-again"]
    assert "NaN" in (first.error or "")
    assert "NaN" in (again.error or "")
    assert [s["had_nan"] for s in scrub_log] == [True, True]  # recomputed, not reused


def test_the_engine_serves_as_before_after_a_failure(engine, poisoned_model):
    # A pool of exactly two blocks: the request after the failure must reuse both blocks
    # the failed one wrote (its prompt and output need two blocks as well).
    two_blocks = 2 * engine.engine_core.kv.block_size * engine.engine_core.bytes_per_token
    small = make_llm(poisoned_model, kv_cache_memory=two_blocks).llm_engine
    assert small.engine_core.kv.pool.num_blocks == 2
    after_prompt = list(range(50, 70))
    run(small, {"poisoned": POISONED})
    after = run(small, {"after": after_prompt})["after"]
    assert after == alone(poisoned_model, "after", after_prompt)
    assert after.error is None and len(after.token_ids) == PARAMS.max_tokens
