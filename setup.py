"""Maps the repository's top-level folders to sub-packages of `officellm` (see __init__.py).

Everything else about the package lives in pyproject.toml; setuptools merges the two. The
package list is computed, so a new folder under one of these is packaged without a list to edit.
"""

from setuptools import find_namespace_packages, setup

OUR_FOLDERS = ("app", "engine", "kernels", "admin_ui", "loadgen", "cli", "migrations", "installer")


def packages() -> list[str]:
    """`officellm` and every folder below OUR_FOLDERS as its sub-package."""
    found = find_namespace_packages(
        include=[pattern for f in OUR_FOLDERS for pattern in (f, f"{f}.*")],
        exclude=["*.__pycache__", "*.__pycache__.*"])
    return ["officellm", *(f"officellm.{name}" for name in found)]


if __name__ == "__main__":
    setup(package_dir={"officellm": "."}, packages=packages())
