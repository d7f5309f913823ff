"""Importing the engine bounds oneDNN's per-shape caches (the soak's memory growth), unless the
operator set them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VARS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
SHOW = f"import os, engine, torch; print(*(os.environ[v] for v in {VARS!r}))"


def capacities(**preset: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in VARS} | preset
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", SHOW], env=env, cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def test_the_engine_bounds_the_caches_by_default() -> None:
    assert capacities() == ["64", "64"]


def test_an_operators_setting_wins() -> None:
    assert capacities(ONEDNN_PRIMITIVE_CACHE_CAPACITY="8") == ["8", "64"]
