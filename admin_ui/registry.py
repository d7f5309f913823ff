"""The server's model registry as `GET /admin/models` answers it (docs/admin_api.md): the
memory budget, what is in use, and one row per registered model. Parsed leniently, like
admin_ui/snapshot.py, so a server a little older or newer than the console still draws.
No Qt here: the Models tab (tabs/models.py) and its table (models/registry_model.py) read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from officellm.admin_ui import format as fmt

DOWNLOADING = "downloading"
# States whose weights are in memory (or on their way there): the model can be unloaded.
IN_MEMORY = ("loading", "ready", "sleeping")


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Download:
    """A Hub download in progress: bytes fetched, and of how many (None until the Hub says)."""

    bytes_done: int
    bytes_total: int | None

    @property
    def fraction(self) -> float | None:
        if not self.bytes_total:
            return None
        return max(0.0, min(1.0, self.bytes_done / self.bytes_total))

    @classmethod
    def from_json(cls, d: Any) -> Download | None:
        if not isinstance(d, dict):
            return None
        return cls(bytes_done=_int(d.get("bytes_done")) or 0, bytes_total=_int(d.get("bytes_total")))


@dataclass(frozen=True)
class ModelRow:
    """One registered model: what it is, where it stands, and what it costs in memory
    (`memory_bytes` is the plan's weights + KV pool, known before it is loaded)."""

    name: str
    source: str = ""
    kind: str = "generate"
    pinned: bool = False
    aliases: tuple[str, ...] = ()
    hub_repo: str | None = None
    state: str = "unloaded"
    memory_bytes: int | None = None
    weight_bytes: int | None = None
    kv_cache_bytes: int | None = None
    kv_tier_ram_bytes: int | None = None  # RAM of the KV tiers below the pool
    last_used: str | None = None
    fits: bool | None = None  # None: not estimated yet (the server plans in the background)
    error: str | None = None
    requests_running: int = 0
    kv_cache_usage: float | None = None
    download: Download | None = None
    default: bool = False

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelRow:
        aliases = d.get("aliases")
        return cls(
            name=str(d.get("name", "")), source=str(d.get("source") or ""),
            kind=str(d.get("kind") or "generate"), pinned=bool(d.get("pinned")),
            aliases=tuple(str(a) for a in aliases) if isinstance(aliases, list) else (),
            hub_repo=str(d["hub_repo"]) if d.get("hub_repo") else None,
            state=str(d.get("state") or "unloaded"),
            memory_bytes=_int(d.get("memory_bytes")), weight_bytes=_int(d.get("weight_bytes")),
            kv_cache_bytes=_int(d.get("kv_cache_bytes")),
            kv_tier_ram_bytes=_int(d.get("kv_tier_ram_bytes")),
            last_used=str(d["last_used"]) if d.get("last_used") else None,
            # null: the server has not planned it yet; only an explicit False is a no.
            fits=d["fits"] if isinstance(d.get("fits"), bool) else None,
            error=str(d["error"]) if d.get("error") else None,
            requests_running=_int(d.get("requests_running")) or 0,
            kv_cache_usage=_float(d.get("kv_cache_usage")),
            download=Download.from_json(d.get("download")), default=bool(d.get("default")))

    @property
    def downloading(self) -> bool:
        return self.state == DOWNLOADING

    @property
    def in_memory(self) -> bool:
        return self.state in IN_MEMORY

    @property
    def state_text(self) -> str:
        """"ready", "failed", ...; a download with its progress: "downloading 42 %"."""
        if not self.downloading or self.download is None:
            return self.state
        fraction = self.download.fraction
        if fraction is None:  # the Hub has not said how much there is yet
            return f"{DOWNLOADING} {fmt.size(self.download.bytes_done)}"
        return f"{DOWNLOADING} {fraction * 100:.0f} %"


@dataclass(frozen=True)
class Registry:
    """One answer of `GET /admin/models`."""

    budget_bytes: int = 0
    used_bytes: int = 0
    models: tuple[ModelRow, ...] = ()

    @classmethod
    def from_json(cls, d: Any) -> Registry:
        if not isinstance(d, dict):
            return cls()
        rows = d.get("models")
        return cls(budget_bytes=_int(d.get("budget_bytes")) or 0,
                   used_bytes=_int(d.get("used_bytes")) or 0,
                   models=tuple(ModelRow.from_json(r) for r in rows if isinstance(r, dict))
                   if isinstance(rows, list) else ())

    @property
    def budget_text(self) -> str:
        """"2.1 of 8.0 GiB in use"."""
        if not self.budget_bytes:
            return f"{fmt.size(self.used_bytes)} in use (no memory budget reported)"
        return f"{fmt.size_of(self.used_bytes, self.budget_bytes)} in use"

    @property
    def downloads(self) -> list[ModelRow]:
        return [m for m in self.models if m.downloading]


def download_progress(rows: Sequence[ModelRow]) -> tuple[float | None, str]:
    """The downloads in progress as one bar: the fraction of all their bytes fetched (None
    while any total is unknown: a busy bar) and its label, "Downloading qwen3-8b: 42 %"."""
    names = ", ".join(r.name for r in rows)
    totals = [r.download.bytes_total if r.download else None for r in rows]
    if not rows or any(not t for t in totals):
        done = sum(r.download.bytes_done for r in rows if r.download)
        return None, f"Downloading {names}: {fmt.size(done)} so far"
    done = sum(r.download.bytes_done for r in rows if r.download)
    fraction = max(0.0, min(1.0, done / sum(t for t in totals if t)))
    return fraction, f"Downloading {names}: {fraction * 100:.0f} %"
