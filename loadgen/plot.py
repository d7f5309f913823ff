"""PNG plots of a run (or of several, overlaid): latency CDFs and throughput over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402


def _latencies(doc: dict[str, Any]) -> dict[str, list[float]]:
    ok = [r for r in doc["requests"] if r["error"] is None]
    itl = [b - a for r in ok for a, b in zip(r["chunk_times_s"], r["chunk_times_s"][1:])]
    return {"TTFT": [r["ttft_s"] for r in ok if r["ttft_s"] is not None],
            "ITL": itl,
            "E2E": [r["e2e_s"] for r in ok if r["e2e_s"] is not None]}


def plot(docs: dict[str, dict[str, Any]], path: Path) -> None:
    """One row: a CDF per latency kind, then output tok/s over time; one line per run."""
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for label, doc in docs.items():
        for ax, (name, values) in zip(axes, _latencies(doc).items()):
            if values:
                xs = sorted(values)
                ys = [(i + 1) / len(xs) for i in range(len(xs))]
                ax.step([x * 1000 for x in xs], ys, where="post", label=label)
            ax.set_title(f"{name} CDF")
            ax.set_xlabel("ms")
            ax.set_ylim(0, 1.02)
        tl = doc["timeline"]
        axes[3].plot([p["t_s"] for p in tl], [p["output_tok_per_s"] for p in tl], label=label)
    axes[3].set_title("output tok/s over time")
    axes[3].set_xlabel("s since start")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
