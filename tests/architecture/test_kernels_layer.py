"""Import rules of the kernels layer: kernels/ is a leaf (it imports nothing of ours), and
tests/ is imported by nothing outside it (benchmarks and the product take what they share
from kernels/ or benchmarks/)."""

from __future__ import annotations

from tests.architecture.import_graph import REPO_ROOT, arrows, is_within

OUR_PACKAGES = ("app", "engine", "admin_ui", "loadgen", "cli", "benchmarks", "tests",
                "migrations", "installer")


def _top_level_folders_with_python() -> list[str]:
    return sorted(p.name for p in REPO_ROOT.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and any(p.rglob("*.py")))


def test_kernels_import_nothing_of_ours():
    offending = [str(a) for a in arrows("kernels")
                 if any(is_within(a.target, package) for package in OUR_PACKAGES)]
    assert not offending, "kernels/ must not import the rest of the project:\n" + "\n".join(offending)


def test_nothing_outside_tests_imports_tests():
    folders = [f for f in _top_level_folders_with_python() if f != "tests"]
    assert "benchmarks" in folders and "kernels" in folders
    offending = [str(a) for a in arrows(*folders) if is_within(a.target, "tests")]
    assert not offending, "only tests/ may import tests:\n" + "\n".join(offending)
