"""The engine's layers: engine/core/ (scheduler, KV cache manager, block pool, requests,
scheduling policy, prefill pacer) is a leaf: plain Python over token ids, no torch and nothing of
the project outside engine/core, so it can be read, tested and reasoned about on its own."""

from __future__ import annotations

from tests.architecture.import_graph import arrows, cycles, is_within

PROJECT_PACKAGES = ("engine", "kernels", "app", "admin_ui", "loadgen", "cli", "benchmarks",
                    "tests")


def test_engine_core_imports_neither_torch_nor_anything_outside_it() -> None:
    leaks = [str(a) for a in arrows("engine/core")
             if is_within(a.target, "torch")
             or (any(is_within(a.target, p) for p in PROJECT_PACKAGES)
                 and not is_within(a.target, "engine.core"))]
    assert not leaks, "\n".join(leaks)


def test_the_engine_imports_nothing_of_the_server_console_or_tools() -> None:
    """Arrows point one way: the engine knows nothing of HTTP, users or SQL."""
    above = ("app", "admin_ui", "loadgen", "cli", "benchmarks", "tests", "installer",
             "migrations")
    leaks = [str(a) for a in arrows("engine") if any(is_within(a.target, p) for p in above)]
    assert not leaks, "\n".join(leaks)


def _engine_node(module: str) -> str:
    """The part of the engine a module is in: `engine.worker.sampler` -> `worker`,
    `engine.engine_core` -> `engine_core`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_the_engines_parts_import_one_another_without_cycles() -> None:
    """Each sub-package and root module of engine/ (its front door, __init__, aside) is a
    node: a cycle means neither part can be read or moved without the other."""
    edges: dict[tuple[str, str], list[str]] = {}
    for arrow in arrows("engine"):
        source = arrow.source.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        if source == "engine" or not is_within(arrow.target, "engine") or arrow.target == "engine":
            continue
        edge = (_engine_node(source), _engine_node(arrow.target))
        if edge[0] != edge[1]:
            edges.setdefault(edge, []).append(str(arrow))
    problems = [f"cycle between {', '.join(group)}:\n  " + "\n  ".join(
        line for (s, t), lines in sorted(edges.items()) if s in group and t in group
        for line in lines) for group in cycles(edges)]
    assert not problems, "\n".join(problems)
