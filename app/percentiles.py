"""The one percentile definition: the server's /admin/stats and `officellm bench` both use it,
so the same samples give the same p50/p99 in the console and in a bench report.

Linear interpolation between the closest ranks (numpy's default, Excel's PERCENTILE.INC),
the definition vLLM's serving benchmark reports with (np.percentile), so bench numbers stay
comparable with theirs.

Why here, a top-level module of app/ and not in observability/ or loadgen/: it is a leaf
(pure standard library, importing nothing of the project), so loadgen, a client, shares the
definition without pulling in any of the server (no app sub-package's __init__ runs), and the
server shares it without importing the load generator, which only the CLI on top may use
(tests/architecture/test_app_layers.py holds both to it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (q in [0, 100]) of `values`, interpolated; None without samples."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], not {q}")
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
