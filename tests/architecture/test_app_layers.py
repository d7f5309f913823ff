"""The app's layers: its sub-packages import one another without cycles, the CLI (cli/, a
top-level folder) sits on top of everything (app, admin_ui, loadgen) and nothing imports it
back, and the load generator shares only the percentile definition with the server.

A node of the app's graph is one sub-package (app/openai/, app/serving/, ...) or one top-level
module (app/server.py, app/errors.py, ...): a cycle between two nodes means neither can be read,
tested or moved without the other.
"""

from __future__ import annotations

from collections import defaultdict

from tests.architecture.import_graph import REPO_ROOT, ImportArrow, arrows, cycles, is_within

CLI_FOLDER = "cli/"
# What counts as CLI code: the command package, and its old homes inside the app (so that a
# command module left there is caught too).
CLI_MODULES = ("cli", "app.cli", "app.commands")
PERCENTILE_LEAF = "app.percentiles"


def _node(module: str) -> str:
    """The app node a module belongs to: `app.openai.routes.chat` -> `openai`,
    `app.server` -> `server`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _source_module(arrow: ImportArrow) -> str:
    return arrow.source.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def _app_edges() -> dict[tuple[str, str], list[ImportArrow]]:
    edges: dict[tuple[str, str], list[ImportArrow]] = defaultdict(list)
    for arrow in arrows("app"):
        if not is_within(arrow.target, "app") or arrow.target == "app":
            continue
        source, target = _node(_source_module(arrow)), _node(arrow.target)
        if source != target:
            edges[(source, target)].append(arrow)
    return edges


def test_app_sub_packages_form_a_dag() -> None:
    edges = _app_edges()
    problems = []
    for group in cycles(edges):
        members = set(group)
        lines = [str(arrow) for (s, t), found in sorted(edges.items())
                 if s in members and t in members for arrow in found]
        problems.append(f"cycle between {', '.join(group)}:\n  " + "\n  ".join(lines))
    assert not problems, "\n".join(problems)


def test_nothing_outside_the_cli_imports_it() -> None:
    bad = [a for a in arrows("app", "admin_ui", "loadgen", "engine", "benchmarks")
           if any(is_within(a.target, cli) for cli in CLI_MODULES)]
    assert not bad, "\n".join(map(str, bad))


def test_no_command_module_lives_inside_the_app() -> None:
    assert not (REPO_ROOT / "app" / "cli").exists()
    assert (REPO_ROOT / CLI_FOLDER / "__init__.py").is_file()


def test_the_app_imports_neither_admin_ui_nor_loadgen() -> None:
    bad = [a for a in arrows("app")
           if is_within(a.target, "admin_ui") or is_within(a.target, "loadgen")]
    assert not bad, "\n".join(map(str, bad))


def test_loadgen_imports_only_the_percentile_leaf_of_app() -> None:
    bad = [a for a in arrows("loadgen")
           if is_within(a.target, "app") and a.target != PERCENTILE_LEAF]
    assert not bad, "\n".join(map(str, bad))


# Leaves of the app: what every layer (and loadgen) may use, so they import nothing of it.
LEAVES = ("app/errors.py", "app/principal.py", "app/percentiles.py")


def test_the_app_leaves_import_nothing_of_the_app() -> None:
    missing = [leaf for leaf in LEAVES if not (REPO_ROOT / leaf).is_file()]
    assert not missing, f"missing leaf modules: {missing}"
    bad = [a for a in arrows("app") if a.source in LEAVES and is_within(a.target, "app")]
    assert not bad, "\n".join(map(str, bad))


def test_app_and_its_migrations_do_not_import_each_other() -> None:
    """migrations/env.py reads app.db's tables; app.db.migrate finds the folder without
    importing it, so the arrow runs one way."""
    wrong = sorted({str(a) for a in arrows("app") if is_within(a.target, "migrations")})
    assert not wrong, "\n".join(wrong)
