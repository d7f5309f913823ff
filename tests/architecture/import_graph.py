"""The project's import arrows, read from the source with `ast` (nothing is imported or run).

The import-rule tests use this to state, per layer, which modules it may import. Every import is
counted: top-level, inside functions, and under `if TYPE_CHECKING:`, since a lazy import is still
an arrow a reader has to follow.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


# Every folder of ours is installed as a sub-package of `officellm` (docs/design.md
# §12); the rules speak of folders, so an arrow's target drops that prefix.
NAMESPACE = "officellm."


@dataclass(frozen=True)
class ImportArrow:
    """One import: the importing file (relative to the repo), its line, the imported module as
    written (`spelled`) and as a folder path (`target`, without the `officellm.` prefix)."""

    source: str
    line: int
    spelled: str

    @property
    def target(self) -> str:
        return self.spelled.removeprefix(NAMESPACE)

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.spelled}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    module = NAMESPACE + module  # a relative import stays inside officellm
    base = module.split(".")
    # A module's own package is its name minus the last part; a package's is itself.
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def python_files(*folders: str) -> list[Path]:
    """Every .py file under the given top-level folders of the repository."""
    files: list[Path] = []
    for folder in folders:
        files.extend(sorted((REPO_ROOT / folder).rglob("*.py")))
    return [f for f in files if "__pycache__" not in f.parts]


def imports_of(path: Path) -> Iterator[ImportArrow]:
    """Each module imported by one file, with `from x import y` counted as `x.y` when y is a
    submodule and as `x` otherwise (so `from engine import core` shows the arrow into core)."""
    source = str(path.relative_to(REPO_ROOT))
    module = _module_name(path)
    tree = ast.parse(path.read_text(), filename=source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield ImportArrow(source, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                target = _resolve_relative(module, path.name == "__init__.py", node.level,
                                           node.module)
            else:
                target = node.module or ""
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                if _is_module(candidate):
                    yield ImportArrow(source, node.lineno, candidate)
                else:
                    yield ImportArrow(source, node.lineno, target)


def _is_module(dotted: str) -> bool:
    path = REPO_ROOT.joinpath(*dotted.removeprefix(NAMESPACE).split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def arrows(*folders: str) -> list[ImportArrow]:
    """Every import made by the files under the given folders."""
    return [arrow for f in python_files(*folders) for arrow in imports_of(f)]


def is_within(target: str, package: str) -> bool:
    """True when the imported module is the package or one of its submodules."""
    return target == package or target.startswith(package + ".")


def cycles(edges: Mapping[tuple[str, str], object]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in edges:
        graph[source].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups
