"""A fault in one request fails that request alone; the engine and the others go on."""

from __future__ import annotations

import torch

from engine import SamplingParams
from tests.engine.conftest import POISON, make_llm


def test_nan_logits_fail_only_that_request(poisoned_model):
    engine = make_llm(poisoned_model, kv_cache_memory="8MiB").llm_engine
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine.add_request("healthy", [10, 11, 12, 13], params)
    engine.add_request("poisoned", [10, POISON, 12, 13], params)
    results: dict[str, list] = {"healthy": [], "poisoned": []}
    errors = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            results[out.request_id].append(out)
            if out.error:
                errors[out.request_id] = out.error
    assert "NaN" in errors["poisoned"]
    assert results["poisoned"][-1].finished
    assert results["poisoned"][-1].outputs[0].finish_reason == "error"
    assert "healthy" not in errors
    assert sum(len(o.outputs[0].token_ids) for o in results["healthy"]) == 8
    assert engine.stats().num_blocks_used == 0
    assert not torch.isnan(engine.engine_core.runner.k_caches[0][0]).all()  # the engine still serves
    engine.add_request("after", [20, 21, 22], params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.error is None
