"""Writing a secret to a file only its owner can read (the admin token, the install key)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_private_file(path: Path, content: str, replace: bool = True) -> bool:
    """Replace `path` with `content` (UTF-8), readable and writable by its owner only (0600).

    The text goes to a temporary file in the same folder, created exclusively with mode 0600
    from the start (never a window where it is world-readable, never someone else's file or
    link reused, nor a crashed run's leftover), flushed to disk, then renamed over `path`:
    a reader sees the old content or the new, never half a secret. The folder must exist.

    `replace=False` keeps a file that is already there (another process made it first) and
    returns False; so two processes making the same secret at once agree on one.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content.encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o600)  # mkstemp's mode is 0600 already; said again in case of an odd umask
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)  # fails where the file exists: never overwrites
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
