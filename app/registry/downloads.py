"""Models being downloaded from the Hugging Face Hub for the registry (the admin API's
`POST /admin/models` with `hub_repo`): their progress, or why they failed."""

from __future__ import annotations

from dataclasses import dataclass, field

from officellm.app.registry.entry import ModelEntry


@dataclass
class Download:
    """One entry's download: bytes so far, the total once known, the failure if any."""

    entry: ModelEntry
    bytes_done: int = 0
    bytes_total: int | None = None
    error: str | None = None

    def report(self, done: int, total: int | None) -> None:
        """Progress callback of hub_pull.pull (called on its worker thread)."""
        self.bytes_done, self.bytes_total = done, total


@dataclass
class Downloads:
    """The server's downloads under way or failed, by model name."""

    by_name: dict[str, Download] = field(default_factory=dict)

    def start(self, entry: ModelEntry) -> Download:
        download = Download(entry)
        self.by_name[entry.name] = download
        return download

    def finish(self, name: str) -> None:
        self.by_name.pop(name, None)
