"""The engine's layers: engine/core/ (scheduler, KV cache manager, block pool, requests,
scheduling policy, prefill pacer) is a leaf: plain Python over token ids, no torch and nothing of
the project outside engine/core, so it can be read, tested and reasoned about on its own."""

from __future__ import annotations

from tests.architecture.import_graph import arrows, is_within

PROJECT_PACKAGES = ("engine", "kernels", "app", "admin_ui", "loadgen", "benchmarks", "tests")


def test_engine_core_imports_neither_torch_nor_anything_outside_it() -> None:
    leaks = [str(a) for a in arrows("engine/core")
             if is_within(a.target, "torch")
             or (any(is_within(a.target, p) for p in PROJECT_PACKAGES)
                 and not is_within(a.target, "engine.core"))]
    assert not leaks, "\n".join(leaks)
