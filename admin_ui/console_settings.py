"""The console's remembered settings (QSettings), as one plain dataclass."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from PySide6.QtCore import QSettings

from officellm.admin_ui.local_server import LaunchConfig
from officellm.installer.paths import ADMIN_TOKEN_FILENAME, default_data_dir

LOCAL, REMOTE = "local", "remote"


@dataclass
class ConsoleSettings:
    """What the console remembers between runs.

    The raw admin token is never stored here (QSettings is a plain file): the console reads it
    from the token file each time, and a token typed in for a remote server lasts one session.
    """

    mode: str = LOCAL  # local: manage a server on this desk; remote: watch one by URL
    model: str = ""  # empty: the bundled SmolLM2
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: str = ""  # the server's data dir; empty: the platform default
    extra_flags: str = ""
    remote_url: str = "http://127.0.0.1:8000"
    token_file: str = ""  # empty: admin_token in the server's data dir
    poll_interval_ms: int = 1000

    def launch_config(self) -> LaunchConfig:
        return LaunchConfig(model=self.model, host=self.host, port=self.port,
                            data_dir=self.data_dir, extra_flags=self.extra_flags)

    def resolved_token_file(self) -> Path:
        if self.token_file:
            return Path(self.token_file).expanduser()
        data = Path(self.data_dir).expanduser() if self.data_dir else default_data_dir()
        return data / ADMIN_TOKEN_FILENAME

    @classmethod
    def load(cls, qs: QSettings | None = None) -> ConsoleSettings:
        qs = qs or QSettings()
        out = cls()
        for f in fields(cls):
            default = getattr(out, f.name)
            value = qs.value(f.name, default)
            # QSettings' ini backend returns strings; convert back to the field's type.
            if isinstance(default, int):
                try:
                    value = int(value)
                except (TypeError, ValueError):
                    value = default
            setattr(out, f.name, value if value is not None else default)
        return out

    def save(self, qs: QSettings | None = None) -> None:
        qs = qs or QSettings()
        for f in fields(self):
            qs.setValue(f.name, getattr(self, f.name))
        qs.sync()


def read_token_file(path: Path) -> str | None:
    """The admin token in `path`, or None if the file is missing or unreadable."""
    try:
        token = path.read_text().strip()
    except OSError:
        return None
    return token or None
