"""What `officellm serve` does with its database at start."""

from __future__ import annotations

import logging
from pathlib import Path

from officellm.app.db.admin_token import ensure_admin_token
from officellm.app.db.database import Database
from officellm.app.db.policies import get_policy

logger = logging.getLogger("officellm.server")


def prepare_database(target: Path | str | None = None) -> tuple[Database, Path | None]:
    """Open the database (a file's path or a URL; default: the data-dir file), upgrade it to
    the newest schema, make sure the default policy row and the admin token exist.

    Returns the Database and the admin token file if it was written just now (print its
    path so the admin knows where to look), else None.
    """
    db = Database(target)
    db.upgrade()
    with db.transaction() as session:
        get_policy(session, None)  # recreates the default row if a hand edit removed it
        adopted = db.jwt_secrets.adopt_legacy_files(session)
    if adopted:
        logger.info("Sealed the JWT secrets of front-end keys %s into the database (their "
                    "files are deleted)", ", ".join(map(str, adopted)))
    return db, ensure_admin_token(db)
