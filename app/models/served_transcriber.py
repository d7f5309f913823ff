"""One speech-to-text model the server serves on /v1/audio/transcriptions and
/v1/audio/translations: its transcriber, its use (leases, last use) and its idle sleep. Its
weights are planned in the memory budget beside the generate models (ModelPool)."""

from __future__ import annotations

import json
from pathlib import Path

from officellm.app.errors import unavailable
from officellm.app.models.served import Served
from officellm.app.registry.entry import ModelEntry
from officellm.app.server_settings import ServerSettings
from officellm.engine import AsyncTranscriber, EngineState, ModelFootprint


def weight_bytes(source: str) -> int:
    """What loading the model directory `source` holds: its weight files' bytes, twice
    that for a 16-bit checkpoint (the transcriber runs float32); 0 if it is not a
    directory (its load then says why)."""
    path = Path(source)
    if not path.is_dir():
        return 0
    size = sum(f.stat().st_size for f in path.iterdir()
               if f.suffix in (".safetensors", ".bin") and f.is_file())
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return size
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return size * 2 if dtype in ("float16", "bfloat16") else size


class ServedTranscriber(Served):
    """A registry entry of kind transcribe and its AsyncTranscriber."""

    def __init__(self, entry: ModelEntry, transcriber: AsyncTranscriber,
                 settings: ServerSettings) -> None:
        super().__init__(entry, transcriber, settings)
        self.transcriber = transcriber
        self.footprint: ModelFootprint | None = None  # planned when it loads

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def leases(self) -> int:
        return self.transcriber.leases

    @property
    def in_memory(self) -> bool:
        """Loaded or loading (what the memory budget counts)."""
        return self.transcriber.is_ready or self.transcriber.waking

    async def wake(self, retry_after_s: int) -> None:
        """Load it if it is out of memory (the request waits); 503 if that fails."""
        self.touch()
        transcriber = self.transcriber
        if (transcriber.state is EngineState.SLEEPING or transcriber.waking
                or transcriber.restartable):
            if not await transcriber.wake():
                raise unavailable(transcriber.unavailable_reason(), retry_after_s)
            self.touch()
        if not transcriber.is_ready:
            raise unavailable(transcriber.unavailable_reason(), retry_after_s)
