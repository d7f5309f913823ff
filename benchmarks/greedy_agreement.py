"""Greedy answers beside the model's own: officellm's default path and llama-server, same file.

Twenty office questions (benchmarks/data/office_questions.txt), each put through the model's
chat template once (officellm's tokenizer), and the same token ids sent to each system:
greedy, up to --tokens new tokens. The reference is the GGUF dequantized to float32 and run
dense with a float32 KV cache (the model as its file defines it; equal to transformers').
For each system and question: how many leading tokens of its answer are the reference's
(an answer that equals the reference's whole counts its length), the median over the
questions, how many answers are the reference's whole, and on how many questions each
system stays with the reference longer than the other does.

llama-server (benchmarks/build_llama_server.sh) gets the ids on /completion with top-k 1,
no prompt cache, one slot, and returns its tokens (`return_tokens`).

    .venv/bin/python benchmarks/greedy_agreement.py [--model FILE.gguf] [--tokens 48]

Results: benchmarks/results/greedy_agreement_<model>.json and .png, with the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compare_cpu import default_llama_server  # noqa: E402
from benchmarks.machine import cpu_description  # noqa: E402
from officellm.loadgen.local_server import Server, free_port  # noqa: E402

RESULTS = Path(__file__).parent / "results"
QUESTIONS = Path(__file__).parent / "data" / "office_questions.txt"
REFERENCE = dict(dtype="float32", quantization="none", kv_cache_dtype="float32")


def leading_agreement(answer: list[int], reference: list[int]) -> int:
    """How many of `answer`'s first tokens are the reference's."""
    n = 0
    for a, r in zip(answer, reference):
        if a != r:
            break
        n += 1
    return n


def officellm_answers(gguf: Path, prompts: list[list[int]], tokens: int, threads: int,
                      settings: dict, one_at_a_time: bool = False
                      ) -> tuple[list[list[int]], str]:
    """Greedy answers (EOS dropped, as llama-server returns them) and how the engine ran:
    the questions batched, or `one_at_a_time` (a lone user: where a GGUF's matmuls read its
    blocks under auto)."""
    from officellm.engine import LLM, SamplingParams

    llm = LLM(str(gguf), kv_cache_memory="512MiB", num_threads=threads, **settings)
    core = llm.llm_engine.engine_core
    described = (f"{str(core.dtype).removeprefix('torch.')}, weights {core.weight_format}, "
                 f"KV {str(core.kv_dtype).removeprefix('torch.')}")
    eos = core.eos_token_ids
    greedy = SamplingParams(temperature=0, max_tokens=tokens)
    outs = ([llm.generate([p], greedy)[0] for p in prompts] if one_at_a_time
            else llm.generate(prompts, greedy))
    answers = [[t for t in o.outputs[0].token_ids if t not in eos] for o in outs]
    del llm
    return answers, described


def llama_server_answers(gguf: Path, prompts: list[list[int]], tokens: int,
                         threads: int) -> list[list[int]] | None:
    try:
        binary, env = default_llama_server()
    except ImportError:
        print("no llama-server (benchmarks/build_llama_server.sh): its row is left out")
        return None
    port = free_port()
    server = Server("llama-server", [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port",
                                     str(port), "-t", str(threads), "-tb", str(threads),
                                     "--parallel", "1", "-c", "4096"], env, port)
    server.start()
    try:
        answers = []
        with httpx.Client(base_url=server.base_url, timeout=600) as client:
            for ids in prompts:
                r = client.post("/completion", json={
                    "prompt": ids, "n_predict": tokens, "temperature": 0, "top_k": 1,
                    "cache_prompt": False, "return_tokens": True})
                r.raise_for_status()
                answers.append([int(t) for t in r.json()["tokens"]])
        return answers
    finally:
        server.stop()
        server.remove_log()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="a .gguf (default: the bundled one)")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from officellm.engine.loading.model_loader import bundled_model_path, resolve_model_dir
    from officellm.engine.loading.tokenizer import load_tokenizer

    gguf = args.model or bundled_model_path()
    tokenizer = load_tokenizer(resolve_model_dir(gguf))
    questions = [q for q in QUESTIONS.read_text().splitlines() if q.strip()]
    prompts = [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                                       add_generation_prompt=True, tokenize=False),
                         add_special_tokens=False)["input_ids"] for q in questions]
    reference, ref_engine = officellm_answers(gguf, prompts, args.tokens, args.threads,
                                              REFERENCE)
    print(f"reference: {ref_engine}", flush=True)
    systems: dict[str, list[list[int]]] = {}
    engines: dict[str, str] = {}
    for name, alone in (("officellm default", True), ("officellm default, batched", False)):
        systems[name], engines[name] = officellm_answers(gguf, prompts, args.tokens,
                                                         args.threads, {}, alone)
    llama = llama_server_answers(gguf, prompts, args.tokens, args.threads)
    if llama is not None:
        systems["llama-server"], engines["llama-server"] = llama, "llama-server, same file"
    rows = []
    for name, answers in systems.items():
        agree = [leading_agreement(a, r) for a, r in zip(answers, reference, strict=True)]
        whole = sum(a == r for a, r in zip(answers, reference, strict=True))
        rows.append({"system": name, "engine": engines[name], "leading": agree,
                     "median_leading": statistics.median(agree), "whole": whole})
        print(f"{name:>18}: leading tokens agreeing, median {statistics.median(agree):g}; "
              f"{whole} of {len(agree)} whole  ({engines[name]})", flush=True)
    if "llama-server" in systems:
        ours, theirs = rows[0]["leading"], rows[-1]["leading"]
        closer = {"officellm default": sum(o > t for o, t in zip(ours, theirs)),
                  "llama-server": sum(t > o for o, t in zip(ours, theirs))}
        print(f"closer to the reference: officellm on {closer['officellm default']}, "
              f"llama-server on {closer['llama-server']}, tied on "
              f"{len(ours) - sum(closer.values())}")
    else:
        closer = {}
    out = args.out or RESULTS / f"greedy_agreement_{gguf.stem}.json"
    result = {"benchmark": "greedy_agreement", "model": gguf.name, "tokens": args.tokens,
              "threads": args.threads, "reference": ref_engine, "questions": questions,
              "cpu": cpu_description(), "systems": rows, "closer": closer}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    _plot(rows, questions, out.with_suffix(".png"), gguf.name)
    print(f"wrote {out} and {out.with_suffix('.png')}")


def _plot(rows: list[dict], questions: list[str], path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 6))
    width = 0.8 / len(rows)
    for k, row in enumerate(rows):
        ax.barh([i + k * width for i in range(len(questions))], row["leading"], height=width,
                label=f"{row['system']} (median {row['median_leading']:g})")
    ax.set_yticks([i + 0.4 - width / 2 for i in range(len(questions))])
    ax.set_yticklabels([q[:48] for q in questions], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("leading tokens equal to the float32 model's greedy answer (higher is better)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=len(rows))
    fig.suptitle(f"Greedy agreement with the float32 model: {model}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
