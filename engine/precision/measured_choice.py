"""Choices the engine measures on this machine (`--dtype auto`, `--quantization auto`), made
once per model and machine and kept in the cache directory.

A timing near its margin is a coin toss: measured again at every start, the same server
would run float32 after one restart and bf16 after the next, and answer the same question
differently. So each answer is kept under a key naming what it depends on (the model, the
threads, the CPU, torch) and reused at the next start, a wake from idle sleep or a reload:
the same model on the same machine starts with the same weights every time, and without the
timing. Deleting the file measures again.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from officellm.engine.loading.model_loader import default_cache_dir
from officellm.kernels.cpu_features import cpu_features

logger = logging.getLogger("officellm.engine.precision.measured_choice")


def machine_key() -> list[str]:
    """What a timing on this machine depends on besides the model: threads, CPU, torch."""
    return [str(torch.get_num_threads()), platform.processor() or platform.machine(),
            cpu_features().describe(), torch.__version__]


def remembered(file_name: str, key: str, measure: Callable[[], Any],
               cache_dir: Path | None = None) -> tuple[Any, Path | None]:
    """`measure()`'s answer for `key` as first measured here (a JSON value), and the file it
    is kept in when it came from there (None: measured now). `cache_dir`: default the
    engine's cache directory."""
    path = (cache_dir or default_cache_dir()) / file_name
    try:
        choices = json.loads(path.read_text())
    except (OSError, ValueError):
        choices = {}
    if key in choices:
        return choices[key], path
    answer = measure()
    choices[key] = answer
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(choices, indent=1))
        tmp.replace(path)  # whole or not at all, whoever else writes it
    except OSError as exc:  # a read-only cache: measured again at the next start
        logger.warning("Cannot keep a measured choice in %s: %s", path, exc)
    return answer, None
