"""Embeddings per second through officellm's /v1/embeddings against sentence-transformers
called directly, in one run on one machine, on the bundled all-MiniLM-L6-v2.

Inputs are document chunks like Open WebUI's (about --chunk-words words each, seeded).
Measured, each over --inputs inputs:

  direct, batch 1      SentenceTransformer.encode, one input per call (the peer)
  direct, batch 32     SentenceTransformer.encode(batch_size=32)
  officellm, batch 1   one request per input, one after another (HTTP + JSON per vector)
  officellm, batch 32  requests of 32 inputs, one after another
  officellm, 8 x 1     8 clients at once, one input per request: the server batches them

Writes benchmarks/results/embeddings_speed.json (the machine, the settings, each row's
embeddings/s and its ratio to the direct call of the same batch size) and .png.

    .venv/bin/python benchmarks/embeddings_speed.py [--threads 2] [--inputs 256]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import cpu_description  # noqa: E402
from officellm.engine import BUNDLED_EMBEDDER, bundled_embedder_dir  # noqa: E402
from officellm.loadgen import text  # noqa: E402
from officellm.loadgen.local_server import Server, free_port  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
KEY = "bench"


def chunks(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(f"embeddings-{seed}")
    return [text.words(rng, words) for _ in range(n)]


def direct(inputs: list[str], batch: int, threads: int) -> float:
    """sentence-transformers' own encode, embeddings/s (after one warm-up call)."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(bundled_embedder_dir()), device="cpu")
    model.encode(inputs[:batch], batch_size=batch)
    t0 = time.perf_counter()
    for i in range(0, len(inputs), batch):
        model.encode(inputs[i:i + batch], batch_size=batch)
    return len(inputs) / (time.perf_counter() - t0)


def through_server(url: str, inputs: list[str], batch: int, clients: int) -> float:
    """officellm's /v1/embeddings, embeddings/s: `clients` at once, `batch` inputs each."""
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)

    def send(part: list[str]) -> None:
        r = http.post("/v1/embeddings", json={"model": BUNDLED_EMBEDDER, "input": part})
        r.raise_for_status()

    send(inputs[:batch])  # warm-up
    parts = [inputs[i:i + batch] for i in range(0, len(inputs), batch)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(send, parts))
    seconds = time.perf_counter() - t0
    http.close()
    return len(inputs) / seconds


def start_server(args: argparse.Namespace) -> Server:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(REPO))
    port = free_port()
    data = Path(os.environ.get("TMPDIR", "/tmp")) / f"embeddings-speed-{port}"
    cmd = [sys.executable, "-m", "officellm.cli", "serve", "--port", str(port),
           "--db", str(data / "officellm.db"), "--embedding-model", BUNDLED_EMBEDDER,
           "--api-key", KEY, "--log-level", "warning"]
    server = Server("officellm-embeddings", cmd, env, port, cwd=REPO)
    server.start(timeout=600)
    return server


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar([r["run"] for r in rows], [r["embeddings_per_s"] for r in rows],
           color=["#888" if r["run"].startswith("direct") else "#36c" for r in rows])
    ax.set_ylabel("embeddings / s")
    ax.set_title("all-MiniLM-L6-v2: sentence-transformers directly vs officellm's /v1/embeddings")
    ax.tick_params(axis="x", rotation=15)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--inputs", type=int, default=256)
    p.add_argument("--chunk-words", type=int, default=150,
                   help="words per input (Open WebUI's 1,000-character chunks: ~150)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "embeddings_speed.json")
    args = p.parse_args()
    inputs = chunks(args.inputs, args.chunk_words, args.seed)
    t0 = time.monotonic()
    rows = [{"run": "direct, batch 1", "embeddings_per_s": direct(inputs, 1, args.threads)},
            {"run": "direct, batch 32", "embeddings_per_s": direct(inputs, 32, args.threads)}]
    server = start_server(args)
    try:
        for label, batch, clients in (("officellm, batch 1", 1, 1),
                                      ("officellm, batch 32", 32, 1),
                                      ("officellm, 8 x 1", 1, 8)):
            rows.append({"run": label,
                         "embeddings_per_s": through_server(server.base_url, inputs, batch,
                                                            clients)})
    finally:
        server.stop()
        server.remove_log()
    peer = {1: rows[0]["embeddings_per_s"], 32: rows[1]["embeddings_per_s"]}
    for row in rows[2:]:
        batch = 32 if "32" in row["run"] else 1
        row["vs_direct_same_batch"] = row["embeddings_per_s"] / peer[batch]
    for row in rows:
        ratio = row.get("vs_direct_same_batch")
        print(f"{row['run']:<22}{row['embeddings_per_s']:>9.1f} embeddings/s"
              + (f"   {ratio:.2f}x direct" if ratio else ""))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": cpu_description(),
                                    "settings": vars(args) | {"out": str(args.out)},
                                    "wall_s": time.monotonic() - t0, "rows": rows}, indent=1))
    plot(rows, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
