"""A .gguf is converted into the cache once, by one process at a time: two starting together
on a fresh cache (two test workers, the console's server and a CLI) must not replace the
directory the other is already reading."""

from __future__ import annotations

import threading
from pathlib import Path

from filelock import FileLock

from officellm.engine.loading import model_loader


def test_a_process_waiting_on_the_conversion_takes_the_finished_one(tmp_path: Path) -> None:
    gguf = model_loader.bundled_model_path()
    target = tmp_path / "gguf" / f"{gguf.stem}-{model_loader._gguf_cache_key(gguf)}"
    target.parent.mkdir(parents=True)
    result: list[Path] = []
    with FileLock(f"{target}.lock"):  # another process is converting
        waiter = threading.Thread(
            target=lambda: result.append(model_loader.resolve_model_dir(gguf, tmp_path)))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive(), "it did not wait for the conversion under way"
        target.mkdir()  # ... which finishes
        (target / "config.json").write_text("{}")
        (target / "model.safetensors").write_bytes(b"the first process's weights")
    waiter.join(30)
    assert result == [target]
    # Taken as it was, not converted again over the first process's files.
    assert (target / "model.safetensors").read_bytes() == b"the first process's weights"
