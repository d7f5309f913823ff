"""(c) Decode step time at several batch sizes against the memory floor.

A decode step must read every weight it multiplies by (all but the embedding table, of which
it reads one row per sequence) plus every live KV entry, so its floor is
(weight bytes + KV bytes read) / copy bandwidth. Requests with `context` prompt tokens are
prefilled through the engine; then steady-state decode steps are timed three ways: the whole
engine step (schedule, prepare, forward, sample, detokenize), the same with async scheduling
off (the serial loop: the GPU waits for the host's work between steps; where async
scheduling is on), and, where CUDA graphs run, the graph replay alone (the GPU's time for
the forward).
"""

from __future__ import annotations

import time

import torch

from benchmarks.gpucheck.models import random_prompts
from officellm.engine.frontend.sampling_params import SamplingParams


def weight_bytes_read(engine, batch: int) -> int:
    """Bytes of weights one decode step of `batch` sequences reads."""
    model = engine.engine_core.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.embed.weight
    tied = model.lm_head is None  # a tied table is read in full by the LM head
    return total - (0 if tied else emb.numel() * emb.element_size()) + \
        (0 if tied else batch * emb.shape[1] * emb.element_size())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _replay_seconds(engine, batch: int, iters: int) -> float | None:
    graphs = engine.engine_core.runner.decode_graphs
    if graphs is None or not graphs.use_graphs:
        return None
    graph = graphs.graphs[graphs.padded_size(batch)]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()  # the static buffers hold the last real step's inputs
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / iters


def _step_seconds(engine, steps: int) -> float:
    """Mean seconds of `steps` engine steps, the device drained before and after."""
    dev = engine.engine_core.device
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    _sync(dev)
    return (time.perf_counter() - t0) / steps


def measure(engine, batch: int, context: int, steps: int, bandwidth: float) -> dict:
    """Prefill `batch` requests of `context` tokens, then time `steps` decode steps."""
    prompts = random_prompts(batch, context, engine.engine_core.spec.vocab_size, seed=batch)
    # Early requests decode while later ones prefill: none may finish before the timing.
    params = SamplingParams(temperature=0, max_tokens=engine.max_model_len - context - 1,
                            ignore_eos=True)
    ids = [f"c{batch}-{i}" for i in range(batch)]
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, params)
    # Until every request has its first token, steps still carry prefills.
    while any(r.num_output_tokens == 0 for r in engine.engine_core.scheduler.running) or \
            engine.engine_core.scheduler.waiting:
        engine.step()
    engine.step()  # one plain decode step, so the graph for this size is warm
    running = list(engine.engine_core.scheduler.running)
    assert len(running) == batch, f"{len(running)} of {batch} requests running"
    tokens_before = sum(r.num_tokens for r in running)
    step_s = _step_seconds(engine, steps)
    serial_s = None
    core = engine.engine_core
    if core.async_scheduling:
        core.async_scheduling = False  # between steps: the step in flight is read first
        try:
            serial_s = _step_seconds(engine, steps)
        finally:
            core.async_scheduling = True
    replay_s = _replay_seconds(engine, batch, steps)
    # Mean live context over the timed steps (early requests decoded during the prefills).
    kv_tokens = (tokens_before + sum(r.num_tokens for r in running)) / 2
    context = round(kv_tokens / batch)
    for rid in ids:
        engine.abort_request(rid)
    kv_bytes = kv_tokens * engine.engine_core.bytes_per_token
    w_bytes = weight_bytes_read(engine, batch)
    floor = (w_bytes + kv_bytes) / bandwidth
    return {"batch": batch, "context": context, "step_ms": step_s * 1e3,
            "serial_step_ms": None if serial_s is None else serial_s * 1e3,
            "graph_replay_ms": None if replay_s is None else replay_s * 1e3,
            "floor_ms": floor * 1e3, "weight_GB": w_bytes / 1e9, "kv_GB": kv_bytes / 1e9,
            "step_vs_floor": step_s / floor,
            "replay_vs_floor": None if replay_s is None else replay_s / floor,
            "tokens_per_s": batch / step_s}


def run(engine, batches: list[int], context: int, steps: int, bandwidth: float) -> dict:
    t0 = time.perf_counter()
    rows = [measure(engine, b, context, steps, bandwidth) for b in batches]
    return {"bandwidth_GBps": bandwidth / 1e9, "rows": rows, "seconds": time.perf_counter() - t0}
