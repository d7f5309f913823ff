"""One greedy request run four ways (alone; again, over its cached prefix; among 16 others;
prefilled in other chunks), printed as JSON: the batch-invariance tests compare the runs.
Run as a script so a test can cap the CPU's level first (OFFICELLM_CPU_ISA=avx2 must be set
before the kernels load): python -m tests.support.invariance_probe MODEL_DIR DTYPE [--batch-invariant]
[--quantization-auto]."""

from __future__ import annotations

import json
import sys

from officellm.engine import LLM, SamplingParams

# A prompt long enough to span several KV blocks and several chunks.
PROMPT = ("Here is a short story. A lighthouse keeper on a small island kept a log of every "
          "ship that passed. One winter night the lamp failed, and he climbed the tower with "
          "a lantern, counting the steps as he went. Continue the story in a few sentences.")
OTHERS = [f"Question {i}: name {i % 5 + 2} animals that live in the {w}."
          for i, w in enumerate(["sea", "desert", "forest", "arctic"] * 4)]
MAX_TOKENS = 32


def run(model_dir: str, dtype: str, batch_invariant: bool,
        quantization: str = "none") -> dict[str, dict[str, list]]:
    """Token ids and logprobs of PROMPT's reply under each of the four runs, how the weights
    were held, and the KV blocks each engine still held at the end."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=1,
                            ignore_eos=True)
    kwargs = dict(dtype=dtype, quantization=quantization, kv_cache_memory="96MiB",
                  batch_invariant=batch_invariant)
    if dtype == "float32":
        kwargs["kv_cache_dtype"] = "float32"
    llm = LLM(model_dir, **kwargs)
    chat = [{"role": "user", "content": PROMPT}]
    prompt = llm.apply_chat_template(chat)
    others = [llm.apply_chat_template([{"role": "user", "content": o}]) for o in OTHERS]
    runs = {"alone": llm.generate([prompt], params)[0],
            "prefix_hit": llm.generate([prompt], params)[0]}
    batch = others[:8] + [prompt] + others[8:]
    runs["in_batch_of_17"] = llm.generate(batch, params)[8]
    chunked = LLM(model_dir, max_num_batched_tokens=24, enable_prefix_caching=False, **kwargs)
    runs["chunked_by_24"] = chunked.generate([prompt], params)[0]
    report = {name: {"token_ids": list(out.outputs[0].token_ids),
                   "logprobs": [lp[t].logprob for lp, t in zip(out.outputs[0].logprobs,
                                                        out.outputs[0].token_ids)]}
            for name, out in runs.items()}
    pools = [engine.llm_engine.engine_core.kv.pool for engine in (llm, chunked)]
    report["engine"] = {"weights": [llm.llm_engine.engine_core.weight_format],
                        "leaked_blocks": [p.num_blocks - p.num_free_blocks for p in pools]}
    return report


def main() -> None:
    model_dir, dtype, *flags = sys.argv[1:]
    quantization = "auto" if "--quantization-auto" in flags else "none"
    print(json.dumps(run(model_dir, dtype, "--batch-invariant" in flags, quantization)))


if __name__ == "__main__":
    main()
