"""The engine has one front door: app/ imports `engine` itself, never one of its submodules, so
the engine's inside can be rearranged without touching the server (engine/__init__.py lists
what the door lets through)."""

from __future__ import annotations

from tests.architecture.import_graph import arrows, is_within


def test_app_imports_only_the_engine_package_itself() -> None:
    through_the_wall = [str(a) for a in arrows("app")
                        if is_within(a.target, "engine") and a.target != "engine"]
    assert not through_the_wall, "\n".join(through_the_wall)
