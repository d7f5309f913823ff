"""AsyncLLM.sleep() and wake(): an idle engine frees its model and loads it again on demand
(`--sleep-idle-seconds` in the server); never while a request runs, once for many wakers,
and the same greedy answer after as before."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from officellm.engine import (
    AsyncLLM,
    EngineConfig,
    EngineDeadError,
    EngineState,
    LLMEngine,
    OutputKind,
    SamplingParams,
)
from tests.support.tiny_models import shared_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    return shared_tiny_model("llama", tmp_path_factory, smollm2_dir)


class Counted:
    """An engine factory that counts its loads."""

    def __init__(self, model: Path) -> None:
        self.model, self.loads = model, 0

    def __call__(self) -> LLMEngine:
        self.loads += 1
        return LLMEngine(EngineConfig(model=str(self.model), dtype="float32",
                                      quantization="none", kv_cache_dtype="float32",
                                      kv_cache_memory="64MiB"))


async def answer(engine: AsyncLLM, rid: str) -> list[int]:
    sink = engine.add_request(rid, [1, 2, 3, 4], GREEDY, kind=OutputKind.FINAL)
    while True:
        out = await sink.get()
        if out.finished:
            return list(out.outputs[0].token_ids)


def run(tiny: Path, body) -> Counted:
    factory = Counted(tiny)

    async def main() -> None:
        engine = AsyncLLM.in_process(factory)
        engine.start()
        try:
            assert await asyncio.to_thread(engine.wait_ready, 120)
            await body(engine)
        finally:
            engine.stop()

    asyncio.run(main())
    return factory


def test_it_sleeps_when_idle_and_wakes_to_the_same_answer(tiny: Path) -> None:
    async def body(engine: AsyncLLM) -> None:
        before = await answer(engine, "a")
        assert engine.sleep()
        assert engine.state is EngineState.SLEEPING and engine.stats() is None
        with pytest.raises(EngineDeadError, match="asleep"):
            engine.add_request("b", [1, 2], GREEDY)
        assert await engine.wake()
        assert await answer(engine, "c") == before

    assert run(tiny, body).loads == 2


def test_it_does_not_sleep_while_a_request_runs(tiny: Path) -> None:
    async def body(engine: AsyncLLM) -> None:
        running = asyncio.ensure_future(answer(engine, "long"))
        await asyncio.sleep(0)  # the request is added
        assert not engine.sleep()
        await running
        assert engine.sleep()

    run(tiny, body)


def test_many_wakers_share_one_load(tiny: Path) -> None:
    async def body(engine: AsyncLLM) -> None:
        assert engine.sleep()
        assert all(await asyncio.gather(*[engine.wake() for _ in range(5)]))
        assert engine.is_ready

    assert run(tiny, body).loads == 2


class FailsOnce(Counted):
    """Its second load fails (the machine's memory was taken meanwhile), the third works."""

    def __call__(self) -> LLMEngine:
        if self.loads == 1:
            self.loads += 1
            raise MemoryError("not enough memory")
        return super().__call__()


def test_a_failed_wake_leaves_it_asleep_saying_why_and_the_next_wake_retries(tiny: Path) -> None:
    failures = []
    factory = FailsOnce(tiny)

    async def main() -> None:
        engine = AsyncLLM.in_process(factory, on_load_failure=failures.append)
        engine.start()
        try:
            assert await asyncio.to_thread(engine.wait_ready, 120)
            assert engine.sleep()
            assert not await engine.wake()
            assert engine.state is EngineState.SLEEPING
            assert "not enough memory" in engine.unavailable_reason()
            assert await engine.wake()
            assert await answer(engine, "after")
        finally:
            engine.stop()

    asyncio.run(main())
    assert factory.loads == 3
    assert failures == []  # only a first load's failure stops the server
