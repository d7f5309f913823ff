"""write_private_file: the one writer of the admin token and the JWT secrets."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from officellm.app.db.private_file import write_private_file


def test_the_file_is_its_owners_only_and_nothing_is_left_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    write_private_file(path, "first\n")
    assert path.read_text() == "first\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["secret"]


def test_an_existing_file_is_replaced_whatever_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("old")
    path.chmod(0o644)
    write_private_file(path, "new")
    assert path.read_text() == "new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_crashed_runs_leftover_does_not_block_the_next_write(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    leftover = tmp_path / f".secret.{os.getpid()}.tmp"  # the old writers' temporary name
    leftover.write_text("half")
    write_private_file(path, "whole")
    assert path.read_text() == "whole"
