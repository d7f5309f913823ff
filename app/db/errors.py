"""Errors the repository functions raise; both are ValueErrors so the CLI prints them plainly."""

from __future__ import annotations


class NotFound(ValueError):
    """No such user, key, ... (the admin API answers 404)."""


class AlreadyExists(ValueError):
    """A unique name is taken (the admin API answers 409)."""
