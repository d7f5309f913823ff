"""A model's process imports nothing heavy before its load thread: its entry module, the child's
half of the process (child_side.py) and the engine's front door load no torch, so the
interpreter's start is the only work it does at full priority beside the models serving
(docs/design.md, "Loads behind the others")."""

from __future__ import annotations

import subprocess
import sys

import pytest

ENTRY_POINTS = ["officellm.engine.core_client.engine_process",
                "officellm.engine.embedding.encoder_process"]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_a_childs_entry_point_imports_no_torch(module: str) -> None:
    probe = (f"import sys, {module}; "
             "heavy = sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules); "
             "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == "", f"{module} imports {out} before its load thread"
