"""Our packages' import names (docs/design.md §12): everything of ours is a
sub-package of `officellm`, so no folder of this repository takes a generic top-level name
that another distribution owns (Hugging Face's `kernels`, which transformers imports)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from tests.architecture.import_graph import REPO_ROOT, arrows

OUR_FOLDERS = ("app", "engine", "kernels", "admin_ui", "loadgen", "cli", "migrations",
               "installer")
EVERY_FOLDER = (*OUR_FOLDERS, "benchmarks", "tests")


def _setup_py_packages() -> list[str]:
    spec = importlib.util.spec_from_file_location("officellm_setup", REPO_ROOT / "setup.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # setup() itself runs only under __main__
    return module.packages()


def test_every_import_of_ours_goes_through_officellm() -> None:
    bare = sorted({str(a) for a in arrows(*EVERY_FOLDER) if a.spelled.split(".")[0] in OUR_FOLDERS})
    assert not bare, "import these as officellm.<folder>:\n" + "\n".join(bare)


def test_the_installed_packages_all_live_under_officellm() -> None:
    packages = _setup_py_packages()
    assert all(p == "officellm" or p.startswith("officellm.") for p in packages), packages
    for folder in OUR_FOLDERS:
        assert f"officellm.{folder}" in packages, f"{folder}/ is not packaged"


def test_hugging_faces_kernels_is_not_shadowed_from_the_repository_root() -> None:
    """`python -m pytest` puts the repository root first on sys.path; `import kernels` must
    still be Hugging Face's (transformers imports it), while ours is officellm.kernels."""
    probe = ("import kernels, transformers.activations, officellm.kernels.cpu_features as ours; "
             "print(kernels.__file__); print(ours.__file__)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    theirs, ours = out[-2], out[-1]
    assert not theirs.startswith(str(REPO_ROOT / "kernels")), f"`import kernels` found ours: {theirs}"
    assert "site-packages" in theirs, theirs
    assert ours.startswith(str(REPO_ROOT / "kernels")), ours
