"""A real model's shape with random weights, as a GGUF written by llama.cpp's own tools: what
the CPU benchmarks race at real sizes (benchmarks/compare_cpu.py --model).

    .venv/bin/python benchmarks/real_shape_gguf.py Qwen3-30B-A3B --layers 12 --quant Q4_K_M

The model: a shipped config (engine/model_configs/, e.g. Qwen3-30B-A3B: hidden 2,048, 128
experts of 768, 8 a token) with its layers cut to --layers (to fit this machine) and
SmolLM2's tokenizer (49,152 tokens: no other tokenizer is on the machine), random weights
(normal, std 0.02; norms 1) as bf16 safetensors; converted by llama.cpp's
convert_hf_to_gguf.py to Q8_0, then quantized by llama-quantize to --quant, both from the
llama.cpp that benchmarks/build_llama_server.sh builds (run it first). Prints the GGUF's path;
the intermediate files are removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHARD_BYTES = 2 * 1024**3


def llama_cpp_root() -> Path:
    """The llama.cpp build of benchmarks/build_llama_server.sh (its newest version)."""
    cache = Path(os.environ.get("OFFICELLM_CACHE_DIR", Path.home() / ".cache" / "officellm"))
    roots = sorted(p.parent.parent.parent for p in
                   cache.glob("llama.cpp/*/build/bin/llama-quantize"))
    if not roots:
        raise SystemExit("No llama.cpp build: run benchmarks/build_llama_server.sh first.")
    return roots[-1]


def config_for(name: str, layers: int | None, vocab: int, bos: int, eos: int) -> dict:
    text = (REPO / "engine" / "model_configs" / f"{name}.json").read_text()
    cfg = json.loads(text)
    if layers is not None:
        cfg["num_hidden_layers"] = layers
        if "max_window_layers" in cfg:
            cfg["max_window_layers"] = layers
        if "layer_types" in cfg:
            cfg["layer_types"] = cfg["layer_types"][:layers]
    cfg.update(vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, torch_dtype="bfloat16")
    return cfg


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model (Hugging Face names) and its shape, from transformers' own
    model class on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = {k: v for k, v in cfg.items() if k not in ("model_type",)}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg["model_type"], **raw))
    # transformers' save format: experts per expert (its checkpoint conversion does this on
    # save; the meta model holds them fused).
    import tempfile

    from safetensors import safe_open

    small = dict(raw, num_hidden_layers=1, hidden_size=64, intermediate_size=64,
                 moe_intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                 head_dim=32, vocab_size=128)
    tiny = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg["model_type"], **small))
    with tempfile.TemporaryDirectory() as d:
        tiny.save_pretrained(d)
        with safe_open(str(Path(d) / "model.safetensors"), "pt") as f:
            names = list(f.keys())
    shapes: dict[str, tuple[int, ...]] = {}
    params = dict(model.named_parameters())
    for layer in range(cfg["num_hidden_layers"]):
        for name in names:
            if not name.startswith("model.layers.0."):
                continue
            real = name.replace("model.layers.0.", f"model.layers.{layer}.")
            shapes[real] = _real_shape(real, params, cfg)
    for name in names:
        if not name.startswith("model.layers."):
            shapes[name] = tuple(params[name].shape)
    return shapes


def _real_shape(name: str, params: dict, cfg: dict) -> tuple[int, ...]:
    if name in params:
        return tuple(params[name].shape)
    # A per-expert matrix: [I, H] for gate/up, [H, I] for down.
    h, i = cfg["hidden_size"], cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    return (h, i) if name.endswith("down_proj.weight") else (i, h)


def write_random_checkpoint(cfg: dict, out: Path, tokenizer_dir: Path, seed: int) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    shard: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}
    files: list[str] = []
    size = 0

    def flush() -> None:
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        files.append(name)
        shard.clear()

    for name, shape in tensor_shapes(cfg).items():
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensor = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        if shard and size + tensor.numel() * 2 > SHARD_BYTES:
            flush()
            size = 0
        shard[name] = tensor
        size += tensor.numel() * 2
    if shard:
        flush()
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": weight_map}, indent=2))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")) \
                or f.name == "generation_config.json":
            shutil.copy(f, out / f.name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config", help="a shipped config's name (engine/model_configs)")
    p.add_argument("--layers", type=int, default=None, help="cut the model to this many layers")
    p.add_argument("--quant", default="Q4_K_M", help="llama-quantize's type (Q4_K_M, Q8_0...)")
    p.add_argument("--out", type=Path, default=Path.home() / ".cache" / "officellm" / "real-shape")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    from transformers import AutoTokenizer

    from officellm.engine.loading.model_loader import resolve_model_dir

    root = llama_cpp_root()
    tok_dir = resolve_model_dir(None)  # the bundled SmolLM2's tokenizer files
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    cfg = config_for(args.config, args.layers, len(tok), tok.bos_token_id or 1,
                     tok.eos_token_id or 2)
    stem = f"{args.config}-{cfg['num_hidden_layers']}L-random"
    target = args.out / f"{stem}.{args.quant}.gguf"
    if target.is_file():
        print(target)
        return
    work = args.out / f"{stem}.work"
    shutil.rmtree(work, ignore_errors=True)
    hf_dir, q8 = work / "hf", work / f"{stem}.Q8_0.gguf"
    print(f"writing random weights to {hf_dir} ...", file=sys.stderr, flush=True)
    write_random_checkpoint(cfg, hf_dir, tok_dir, args.seed)
    src = root / "src" / "vendor" / "llama.cpp"
    env = dict(os.environ, PYTHONPATH=str(src / "gguf-py"))
    print("converting with llama.cpp's convert_hf_to_gguf.py ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(hf_dir),
                    "--outtype", "q8_0", "--outfile", str(q8)], check=True, env=env)
    shutil.rmtree(hf_dir)
    print(f"quantizing to {args.quant} with llama-quantize ...", file=sys.stderr, flush=True)
    subprocess.run([str(root / "build" / "bin" / "llama-quantize"), "--allow-requantize",
                    str(q8), str(target), args.quant], check=True)
    shutil.rmtree(work)
    print(target)


if __name__ == "__main__":
    main()
