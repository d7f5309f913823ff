"""Fixtures for the installer tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.installer.installer_helpers import make_sandbox_env


@pytest.fixture
def sandbox_env(tmp_path: Path) -> dict[str, str]:
    """HOME and XDG dirs under tmp_path (see installer_helpers.make_sandbox_env)."""
    return make_sandbox_env(tmp_path)
