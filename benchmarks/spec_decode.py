"""N-gram speculative decoding on the bundled model, on the CPU, in one run: how much faster
code edits stream with `--speculative-config`, and what it costs an office chatting (its
adaptivity: chat rarely repeats its prompt, so its drafts should stay out of the way).

Each scenario runs twice on a fresh `officellm serve` (office profile, the bundled GGUF,
default dtype and quantization), without and with `--speculative-config
'{"method": "ngram", "num_speculative_tokens": K}'`:

  code-edit-1, code-edit-4   users asking to rename a function in a ~600-token file and to
                             get the whole file back (officellm bench --scenario code-edit)
  office-16                  16 people chatting (officellm bench --scenario office)

Time per output token (TPOT: a request's time after its first token over its tokens after
the first) is the per-token speed a user sees; with speculation several tokens can arrive in
one event, so the gap between events (ITL) is reported too but is not per token. Writes
benchmarks/results/spec_decode.json and .png, with the CPU.

    .venv/bin/python benchmarks/spec_decode.py [--threads 2] [--duration 40] [--k 4]

With --llama-spec-types, llama.cpp's llama-server (benchmarks/build_llama_server.sh's native
build) runs the code edits on the same GGUF too, without and with each of its n-gram
speculation types at llama.cpp's own settings: the best type is the peer.

    .venv/bin/python benchmarks/spec_decode.py --llama-spec-types ngram-simple ngram-map-k \
        ngram-mod
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import cpu_description  # noqa: E402
from officellm.loadgen import report  # noqa: E402
from officellm.loadgen.local_server import Server, free_port  # noqa: E402
from officellm.loadgen.runner import Target, run_bench  # noqa: E402
from officellm.loadgen.scenarios import ScenarioConfig  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"


def start_server(args: argparse.Namespace, spec: bool, tmp: Path) -> Server:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(REPO))
    port = free_port()
    cmd = [sys.executable, "-m", "officellm.cli", "serve", "--port", str(port), "--no-auth",
           "--db", str(tmp / f"{port}.db"), "--profile", "office", "--max-model-len", "4096",
           "--log-level", "warning"]
    if spec:
        cmd += ["--speculative-config",
                json.dumps({"method": "ngram", "num_speculative_tokens": args.k})]
    server = Server(f"officellm-{'spec' if spec else 'plain'}", cmd, env, port, cwd=REPO)
    server.start(timeout=600)
    return server


def start_llama_server(args: argparse.Namespace, spec_type: str | None) -> Server:
    """llama-server on the bundled GGUF (compare_cpu.py's binary and settings), with one of its
    n-gram speculation types (`--spec-type`, at llama.cpp's defaults: its m-gram drafts run
    up to 48 tokens, ngram-mod's up to 64) or none."""
    from benchmarks.compare_cpu import default_llama_server
    from officellm.engine.loading.model_loader import bundled_model_path

    binary, env = (args.llama_server, dict(os.environ)) if args.llama_server else \
        default_llama_server()
    port = free_port()
    cmd = [binary, "-m", bundled_model_path(), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(args.threads), "-tb", str(args.threads), "--parallel", "4",
           "-c", str(4 * 4096), "--metrics"]
    if spec_type is not None:  # with llama.cpp's own draft lengths for the type
        cmd += ["--spec-type", spec_type]
    server = Server(f"llama-server-{spec_type or 'plain'}", cmd, env, port, cwd=REPO)
    server.start(timeout=300)
    return server


def scenarios(args: argparse.Namespace) -> list[tuple[str, ScenarioConfig]]:
    edit = dict(max_tokens=args.edit_max_tokens, think_time=1.0, file_tokens=args.file_tokens)
    runs = [("code-edit-1", ScenarioConfig("code-edit", 1, args.seed, **edit)),
            ("code-edit-4", ScenarioConfig("code-edit", 4, args.seed, **edit)),
            ("office-16", ScenarioConfig("office", 16, args.seed, 128, 1.0))]
    return [(label, config) for label, config in runs if not args.only or label in args.only]


def run(args: argparse.Namespace, spec: bool, tmp: Path,
        llama: str | None = None) -> dict[str, dict[str, Any]]:
    """Each scenario on a fresh server: officellm with or without drafts, or, with `llama`
    ("plain" or a --spec-type), llama-server (the code edits only)."""
    docs = {}
    for label, config in scenarios(args):
        if llama is not None and config.name != "code-edit":
            continue
        server = (start_server(args, spec, tmp) if llama is None else  # fresh every run
                  start_llama_server(args, None if llama == "plain" else llama))
        try:
            # An agent applying an edit asks for the likeliest text (temperature 0); the
            # office chats as front ends do (the server's default sampling).
            target = Target(server.base_url, api_key=None, max_context=4096,
                            extra_body={"temperature": 0.0} if config.name == "code-edit"
                            else {"ignore_eos": True})
            doc = report.build(asyncio.run(run_bench(target, config, None, args.duration)))
            docs[label] = doc
            print(f"[{label} {server.name}] {report.text_summary(doc)}", flush=True)
        finally:
            server.stop()
            server.remove_log()
    return docs


def _p50(doc: dict[str, Any], key: str) -> float | None:
    return doc["summary"][key]["p50"]


def table(plain: dict[str, Any], spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    lines = [f"{'scenario':<13}{'TPOT p50 ms off/on':>21}{'speed-up':>10}{'ITL p50 ms off/on':>20}"
             f"{'out tok/s off/on':>19}{'ratio':>7}{'drafts kept':>16}"]
    ratios: dict[str, Any] = {}
    for label in plain:
        a, b = plain[label], spec[label]
        ta, tb = _p50(a, "tpot_s"), _p50(b, "tpot_s")
        ia, ib = _p50(a, "itl_s"), _p50(b, "itl_s")
        sa, sb = a["summary"]["output_tok_per_s"], b["summary"]["output_tok_per_s"]
        speedup = ta / tb if ta and tb else None
        ratio = sb / sa if sa else None
        metrics = b["server_metrics"]
        drafted, kept = metrics.get("spec_draft_tokens"), metrics.get("spec_accepted_tokens")
        ratios[label] = {"tpot_p50_speedup": speedup, "output_tok_per_s_on_over_off": ratio,
                         "draft_tokens": drafted, "kept_tokens": kept}

        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x * 1000:.1f}"

        lines.append(f"{label:<13}{ms(ta) + ' / ' + ms(tb):>21}"
                     f"{'-' if speedup is None else f'{speedup:.2f}x':>10}"
                     f"{ms(ia) + ' / ' + ms(ib):>20}{f'{sa:.1f} / {sb:.1f}':>19}"
                     f"{'-' if ratio is None else f'{ratio:.2f}':>7}"
                     f"{f'{kept or 0:.0f} of {drafted or 0:.0f}':>16}")
    return "\n".join(lines), ratios


def llama_table(spec: dict[str, Any], llama: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """officellm with drafts against llama-server without and with its best n-gram type, per
    code-edit scenario (TPOT p50: lower is better)."""
    lines = [f"{'scenario':<13}{'officellm spec TPOT':>20}{'llama plain':>13}"
             f"{'llama best spec':>24}{'officellm/llama':>17}"]
    ratios: dict[str, Any] = {}
    for label in [k for k in spec if k.startswith("code-edit")]:
        ours = _p50(spec[label], "tpot_s")
        plain = _p50(llama["plain"][label], "tpot_s") if label in llama.get("plain", {}) else None
        typed = {t: _p50(d[label], "tpot_s") for t, d in llama.items()
                 if t != "plain" and label in d and _p50(d[label], "tpot_s")}
        best = min(typed, key=typed.__getitem__) if typed else None
        best_tpot = typed[best] if best else None
        ratio = ours / best_tpot if ours and best_tpot else None
        ratios[label] = {"officellm_spec_tpot_s": ours, "llama_plain_tpot_s": plain,
                         "llama_best_spec_type": best, "llama_best_spec_tpot_s": best_tpot,
                         "llama_tpot_by_type": typed,
                         "officellm_tpot_over_llama_best": ratio}

        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x * 1000:.1f} ms"

        lines.append(f"{label:<13}{ms(ours):>20}{ms(plain):>13}"
                     f"{(ms(best_tpot) + f' ({best})') if best else '-':>24}"
                     f"{'-' if ratio is None else f'{ratio:.2f}':>17}")
    return "\n".join(lines), ratios


def plot(plain: dict[str, Any], spec: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(plain)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = range(len(labels))
    for off, docs, name in ((-0.2, plain, "without"), (0.2, spec, "with n-gram drafts")):
        axes[0].bar([x + off for x in xs], [(_p50(docs[k], "tpot_s") or 0) * 1000
                                            for k in labels], width=0.4, label=name)
        axes[1].bar([x + off for x in xs], [docs[k]["summary"]["output_tok_per_s"]
                                            for k in labels], width=0.4, label=name)
    axes[0].set_title("time per output token, p50 (ms; lower is better)")
    axes[1].set_title("output tokens per second (higher is better)")
    for ax in axes:
        ax.set_xticks(list(xs), labels)
        ax.grid(alpha=0.3, axis="y")
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--duration", type=float, default=40.0, help="seconds of load per run")
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--file-tokens", type=int, default=600)
    p.add_argument("--edit-max-tokens", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", nargs="+", default=None, metavar="SCENARIO",
                   help="run only these (code-edit-1, code-edit-4, office-16)")
    p.add_argument("--repeat", type=int, default=1,
                   help="alternate without/with this many times (the best of each is kept)")
    p.add_argument("--llama-spec-types", nargs="*", default=[],
                   metavar="TYPE", help="also run llama-server on the code edits, without "
                   "and with each of these --spec-type values (ngram-simple, ngram-map-k, "
                   "ngram-mod, ...); the best is compared")
    p.add_argument("--llama-server", default=None, help="path of a llama-server binary "
                   "(default: benchmarks/build_llama_server.sh's build)")
    p.add_argument("--out", type=Path, default=RESULTS / "spec_decode.json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain: dict[str, Any] = {}
        spec: dict[str, Any] = {}
        for _ in range(args.repeat):  # alternating, so a slow spell hits both alike
            for docs, on in ((plain, False), (spec, True)):
                for label, doc in run(args, on, Path(tmp)).items():
                    best = docs.get(label)
                    if best is None or (doc["summary"]["output_tok_per_s"]
                                        > best["summary"]["output_tok_per_s"]):
                        docs[label] = doc
        llama: dict[str, dict[str, Any]] = {}
        if args.llama_spec_types:
            for kind in ["plain", *args.llama_spec_types]:
                llama[kind] = run(args, False, Path(tmp), llama=kind)
    text, ratios = table(plain, spec)
    print(text)
    out = {"machine": cpu_description(), "settings": vars(args) | {"out": str(args.out)},
           "ratios": ratios, "plain": plain, "spec": spec}
    if llama:
        text, against = llama_table(spec, llama)
        print(text)
        out |= {"llama_server": llama, "against_llama_server": against}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str))
    plot(plain, spec, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
