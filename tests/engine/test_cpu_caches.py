"""Starting the engine bounds oneDNN's per-shape caches (the soak's memory growth), unless the
operator set them; importing the engine alone sets nothing (no import-time side effect)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VARS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
SHOW = "import os; print(*(os.environ.get(v, '-') for v in {vars!r}))"
# The engine starts in EngineCore (rank 0, before its first matmul and before any worker
# process, which inherits the environment).
START = ("import os, officellm.engine, torch; " + SHOW + "; "
         "officellm.engine.LLM({model!r}, device='cpu', dtype='float32', max_model_len=256, "
         "kv_cache_memory='8MiB', quantization='none'); " + SHOW)


def capacities(model_dir: Path, **preset: str) -> list[list[str]]:
    """The capacities after `import officellm.engine`, then after the engine started."""
    env = {k: v for k, v in os.environ.items() if k not in VARS} | preset
    env["PYTHONPATH"] = str(REPO)
    code = START.format(vars=VARS, model=str(model_dir))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    return [line.split() for line in out.splitlines()]


def test_the_engine_bounds_the_caches_when_it_starts(smollm2_dir: Path) -> None:
    assert capacities(smollm2_dir) == [["-", "-"], ["64", "64"]]


def test_an_operators_setting_wins(smollm2_dir: Path) -> None:
    assert capacities(smollm2_dir, ONEDNN_PRIMITIVE_CACHE_CAPACITY="8") == [["8", "-"], ["8", "64"]]
