"""A .gguf is described in the cache once, by one process at a time (two starting together
on a fresh cache, two test workers, the console's server and a CLI, must not replace the
directory the other is already reading), and its weights stay in the file: the cache holds
a few MB, never a dense copy."""

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
        (target / "SOURCE").write_text("the first process's description")
    waiter.join(30)
    assert result == [target]
    # Taken as it was, not described again over the first process's files.
    assert (target / "SOURCE").read_text() == "the first process's description"


def _tree_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def test_serving_a_gguf_leaves_a_few_megabytes_in_the_cache(tmp_path: Path) -> None:
    from officellm.engine import LLM, SamplingParams

    gguf = model_loader.bundled_model_path()
    model_dir = model_loader.resolve_model_dir(gguf, tmp_path)
    llm = LLM(str(model_dir), kv_cache_memory="32MiB")
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
    described = [d for d in (tmp_path / "gguf").glob(f"{gguf.stem}-*") if d.is_dir()]
    assert described == [model_dir] and not list(described[0].glob("*.safetensors"))
    assert _tree_bytes(tmp_path / "gguf") < 5 * 1024**2, "a copy of the weights was written"


def test_an_earlier_readers_dense_copy_of_the_same_file_is_removed(tmp_path: Path) -> None:
    gguf = model_loader.bundled_model_path()
    old = tmp_path / "gguf" / f"{gguf.stem}-0123456789abcdef"
    old.mkdir(parents=True)
    (old / "SOURCE").write_text(f"{gguf.resolve()}\n")
    (old / "config.json").write_text("{}")
    (old / "model-00001.safetensors").write_bytes(b"a dense float32 copy")
    other = tmp_path / "gguf" / f"{gguf.stem}-fedcba9876543210"  # another file's, same name
    other.mkdir()
    (other / "SOURCE").write_text("/elsewhere/SmolLM2-135M-Instruct.Q4_1.gguf\n")
    model_dir = model_loader.resolve_model_dir(gguf, tmp_path)
    assert not old.exists()
    assert other.exists() and model_dir.exists()

