"""The console's layer (docs/design.md §12): admin_ui/ knows the server only through its HTTP
admin API, so it imports none of the server's packages (app, engine, kernels, migrations).
What it must share with the server on disk (the data dir, the admin-token file's name) comes
from the leaf module `installer/paths.py`, which imports nothing of officellm's."""

from __future__ import annotations

from tests.architecture.import_graph import arrows, is_within, python_files

SERVER_PACKAGES = ("app", "engine", "kernels", "migrations")


def test_admin_ui_imports_no_server_package() -> None:
    wrong = sorted({str(a) for a in arrows("admin_ui")
                    if any(is_within(a.target, pkg) for pkg in SERVER_PACKAGES)})
    assert not wrong, "admin_ui talks to the server over HTTP only:\n" + "\n".join(wrong)


def test_the_installers_paths_are_a_leaf() -> None:
    """Both sides import installer.paths, so it may import neither side (nor anything of ours)."""
    assert python_files("installer"), "installer/paths.py is missing"
    ours = (*SERVER_PACKAGES, "admin_ui", "loadgen", "benchmarks", "tests")
    wrong = sorted({str(a) for a in arrows("installer")
                    if any(is_within(a.target, p) for p in ours)})
    assert not wrong, "\n".join(wrong)
