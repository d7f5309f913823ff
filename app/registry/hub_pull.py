"""`officellm models pull`: a model's files from the Hugging Face Hub into a directory of its
own, only those the engine reads, resumable file by file."""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from officellm.installer.paths import default_data_dir

Progress = Callable[[int, int | None], None]

# What a Hugging Face model directory needs: config and generation config, the tokenizer
# (tokenizer.json, or vocab/merges files, or a SentencePiece model), chat templates, the
# safetensors weights, and sentence-transformers' modules.json and per-module configs.
NEEDED = ("*.json", "*.safetensors", "tokenizer.model", "spiece.model", "*.txt", "*.jinja",
          "*.tiktoken")
# Other runtimes' copies of the same model (ONNX, OpenVINO, Core ML, Meta's own format):
# large, and never read by the engine.
SKIPPED_FOLDERS = ("onnx", "openvino", "coreml", "original", "tflite")
GGUF = "*.gguf"


def default_models_dir() -> Path:
    """Where pulled models go: `models` in officellm's data directory."""
    return default_data_dir() / "models"


def pulled_dir(repo_id: str) -> Path:
    """The directory a repo is pulled into: `Qwen/Qwen3-8B` -> models/Qwen--Qwen3-8B."""
    return default_models_dir() / repo_id.replace("/", "--")


def select_files(files: list[str], filename: str | None = None) -> list[str]:
    """The repo files a pull fetches, small ones first (so a model's config is there before
    its weights). `filename` names one file to fetch alone (a .gguf of a GGUF-only repo,
    which has several quantizations); a repo with no safetensors but exactly one .gguf gets
    that one. ValueError, naming what there is, when nothing fits."""
    if filename is not None:
        if filename not in files:
            raise ValueError(f"The repo has no file {filename!r}; it has "
                             f"{', '.join(sorted(files)) or 'no files'}.")
        return [filename]
    wanted = [f for f in files if _needed(f)]
    if any(f.endswith(".safetensors") for f in wanted):
        return sorted(wanted, key=lambda f: (f.endswith(".safetensors"), f))
    ggufs = sorted(f for f in files if fnmatch.fnmatch(f, GGUF))
    if len(ggufs) == 1:
        return ggufs
    if ggufs:
        raise ValueError(f"The repo has GGUF files only; choose one with --filename: "
                         f"{', '.join(ggufs)}.")
    raise ValueError("The repo has neither safetensors weights nor a .gguf file: officellm "
                     "cannot serve it (a .bin, .pt or .onnx checkpoint is not read).")


def _needed(path: str) -> bool:
    parts = PurePosixPath(path).parts
    if any(p in SKIPPED_FOLDERS for p in parts[:-1]):
        return False
    return any(fnmatch.fnmatch(parts[-1], pattern) for pattern in NEEDED)


class _Counter:
    """Bytes done across the pull: the files finished plus the one in flight."""

    def __init__(self, total: int | None, report: Progress | None) -> None:
        self.total, self.report = total, report
        self.finished = 0
        self.in_flight = 0

    def add(self, n: int) -> None:
        self.in_flight += n
        self.tell()

    def file_done(self, size: int) -> None:
        self.finished += size
        self.in_flight = 0
        self.tell()

    def tell(self) -> None:
        if self.report is not None:
            self.report(self.finished + self.in_flight, self.total)


def _bar_class(counter: _Counter) -> type:
    """A progress-bar class for huggingface_hub that draws nothing and hands each chunk's
    bytes to `counter` (the library's own bar would write over the CLI's line)."""
    from huggingface_hub.utils import tqdm as hub_tqdm

    class _Forward(hub_tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            counter.add(int(n or 0))
            return super().update(n)

    return _Forward


def pull(repo_id: str, dest: Path, revision: str | None = None,
         progress: Progress | None = None, filename: str | None = None,
         endpoint: str | None = None,
         check_config: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """Download the files `repo_id` needs (select_files) at `revision` (default: main) into
    `dest`, calling `progress(bytes_done, bytes_total)` as bytes arrive (total None when the
    Hub does not say). Returns what to register as the model's source: `dest`, or the .gguf
    file in it.

    Resumable: every file is fetched at the commit `revision` resolves to now, and a file
    already complete in `dest` at that commit is not fetched again, so a pull run again after
    an interruption fetches only what is missing (a file cut off midway starts over).
    `endpoint` (default $HF_ENDPOINT, else huggingface.co) is the Hub's address.
    `check_config` is called with the repo's config.json as soon as it has arrived, before
    any weight: whatever it raises (a model the engine cannot run) ends the pull there.
    """
    from huggingface_hub import HfApi, hf_hub_download

    # Read per call, not at import as huggingface_hub does, so a mirror set later applies.
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True)
    sizes = {s.rfilename: s.size for s in info.siblings or ()}
    wanted = select_files(list(sizes), filename)
    known = [sizes[f] for f in wanted]
    total = sum(s for s in known if s is not None) if None not in known else None
    counter = _Counter(total, progress)
    counter.tell()
    dest.mkdir(parents=True, exist_ok=True)
    for name in wanted:
        # The commit, not the branch: every file from one snapshot of the repo, and a file
        # already complete at that commit is recognised without asking the Hub.
        local = hf_hub_download(repo_id, name, revision=info.sha or revision,
                                local_dir=dest,
                                endpoint=endpoint, tqdm_class=_bar_class(counter))
        counter.file_done(sizes[name] if sizes[name] is not None else Path(local).stat().st_size)
        if name == "config.json" and check_config is not None:
            check_config(json.loads(Path(local).read_text()))
    if len(wanted) == 1 and wanted[0].endswith(".gguf"):
        return dest / wanted[0]
    return dest
