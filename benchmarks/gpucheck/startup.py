"""(e) The engine's start-up lines (memory profiling, realized pool, concurrency)."""

from __future__ import annotations

import logging
from contextlib import contextmanager


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def capture_engine_logs():
    """Collect the INFO lines the engine logs while the block runs."""
    handler = _Collect()
    root = logging.getLogger("engine")
    old = root.level
    root.setLevel(logging.INFO)
    root.addHandler(handler)
    try:
        yield handler.lines
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


def summarize(engine, lines: list[str], seconds: float) -> dict:
    s = engine.stats()
    return {
        "log": lines,
        "startup_seconds": seconds,
        "kv_cache_tokens": s.kv_cache_tokens,
        "num_blocks": s.num_blocks_total,
        "bytes_per_token": s.bytes_per_token,
        "max_model_len": s.max_model_len,
        "max_concurrency_at_32k": s.kv_cache_tokens / 32768,
        "cuda_graphs": engine.engine_core.runner.decode_graphs is not None,
        "backend": engine.engine_core.backend,
    }
