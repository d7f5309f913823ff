"""Where officellm keeps its files on this machine: the per-user data directory, and the name
of the admin-token file the server writes into it.

The server (app/db/paths.py) and the console (admin_ui) both need these, and they must agree:
the console finds the admin token of a server on this desk by looking where the server wrote
it. The console otherwise knows the server only through its HTTP admin API
(docs/design.md §12), so this knowledge lives beside installer/paths.sh (which lays out the
same directories for the shell scripts) in a module that imports nothing of officellm's (only
platformdirs): the console reads it without importing the server, and the server keeps
writing where the console looks.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

ADMIN_TOKEN_FILENAME = "admin_token"
DATA_DIR_ENV = "OFFICELLM_DATA_DIR"


def default_data_dir() -> Path:
    """The per-user data directory (e.g. ~/.local/share/officellm); OFFICELLM_DATA_DIR overrides."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_data_dir("officellm", appauthor=False))
