"""Who the CLI's changes are recorded as in the audit log: "cli:" and the operating-system
user running it, for its own database writes and for its admin API calls alike (which send it
in the X-Officellm-Client header, docs/admin_api.md)."""

from __future__ import annotations

import getpass

# The header the admin API reads the caller's "cli:USER" from (app/admin/access.py).
CLIENT_HEADER = "X-Officellm-Client"


def os_user() -> str:
    """The operating-system user, in ASCII (an HTTP header's characters); "unknown" where the
    system cannot say (a container without a passwd entry)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
    return name.encode("ascii", "backslashreplace").decode("ascii")[:64] or "unknown"


def cli_actor() -> str:
    """The audit log's actor for this CLI run: cli:USER."""
    return f"cli:{os_user()}"
