"""The model registry's rows (registered_models) read and written as ModelEntry values:
the CLI, the admin API and the server's model pool never see the ORM class."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from officellm.app.db.errors import AlreadyExists
from officellm.app.db.tables import RegisteredModel
from officellm.app.registry.entry import ModelEntry

# What update_entry may change; name, source and kind make another model (remove and add).
UPDATABLE = ("pinned", "sleep_idle_seconds", "aliases", "options")


def _entry(row: RegisteredModel) -> ModelEntry:
    return ModelEntry(name=row.name, source=row.source, kind=row.kind, pinned=row.pinned,
                      aliases=tuple(row.aliases or ()),
                      sleep_idle_seconds=row.sleep_idle_seconds,
                      options=dict(row.options or {}), hub_repo=row.hub_repo)


def _row(session: Session, name: str) -> RegisteredModel | None:
    return session.scalar(select(RegisteredModel).where(RegisteredModel.name == name))


def list_entries(session: Session) -> list[ModelEntry]:
    """Every registered model, in the order they were added."""
    rows = session.scalars(select(RegisteredModel).order_by(RegisteredModel.id))
    return [_entry(r) for r in rows]


def get_entry(session: Session, name: str) -> ModelEntry | None:
    """The entry registered as `name`, or None."""
    row = _row(session, name)
    return _entry(row) if row is not None else None


def add_entry(session: Session, entry: ModelEntry) -> None:
    """Register `entry`; ValueError if it is invalid (ModelEntry.check), AlreadyExists (a
    ValueError) if its name is taken."""
    entry.check()
    if _row(session, entry.name) is not None:
        raise AlreadyExists(f"A model named {entry.name!r} is already registered; remove it "
                            f"first or choose another name.")
    session.add(RegisteredModel(
        name=entry.name, source=entry.source, kind=entry.kind, pinned=entry.pinned,
        aliases=list(entry.aliases), sleep_idle_seconds=entry.sleep_idle_seconds,
        options=dict(entry.options), hub_repo=entry.hub_repo))
    session.flush()


def remove_entry(session: Session, name: str) -> bool:
    """Unregister `name`; False if no model had that name."""
    row = _row(session, name)
    if row is None:
        return False
    session.delete(row)
    session.flush()
    return True


def update_entry(session: Session, name: str, **changes: Any) -> ModelEntry | None:
    """Change some of `name`'s UPDATABLE fields and return the new entry (None if no model
    had that name). The changed entry is checked as a whole before anything is written, so a
    bad value leaves the row as it was (ValueError)."""
    unknown = set(changes) - set(UPDATABLE)
    if unknown:
        raise ValueError(f"Cannot change {', '.join(sorted(unknown))} of a registered model; "
                         f"only {', '.join(UPDATABLE)} (remove and add it again for the rest).")
    row = _row(session, name)
    if row is None:
        return None
    if "aliases" in changes:
        changes["aliases"] = tuple(changes["aliases"])
    if "options" in changes:
        changes["options"] = dict(changes["options"])
    updated = replace(_entry(row), **changes)
    updated.check()
    row.pinned, row.sleep_idle_seconds = updated.pinned, updated.sleep_idle_seconds
    row.aliases, row.options = list(updated.aliases), dict(updated.options)
    session.flush()
    return updated
