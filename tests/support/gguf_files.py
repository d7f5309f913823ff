"""Tiny GGUF files of every family officellm runs, written here as llama.cpp's converter
writes them (its conversion/*.py, read for each architecture): gguf-py's own tensor names
for the architecture (TensorNameMap), the metadata keys the converter sets, its transforms
(llama-arch q/k rows permuted, Gemma's norms stored as 1 + w, experts stacked, gpt-oss's
interleaved gate_up split in two), and the block types of the usual downloads.

`write_gguf` also returns what each Hugging Face tensor is after the round trip through the
file's blocks (`expected`): a reader is right when it gives exactly these values, and the
engine on the GGUF is right when it answers as the engine on a safetensors directory holding
them (`write_reference_dir`). Quantizing moves no value between rows, so the expected value
of a tensor is its rows (one per output feature) quantized and dequantized in place,
whatever order the converter put them in.

The models: tests/support/tiny_models.py's, widened where a K-quant needs it (every matmul's
input a multiple of 256: `GGUF_SHAPES`), with a 1024-token cut of the bundled SmolLM2
tokenizer (`small_tokenizer`) so the GGUF's vocabulary converts in a blink.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from officellm.kernels.reference import quant_reference as qr

VOCAB = 1024
S, F = "sliding_attention", "full_attention"
# model_type -> llama.cpp's architecture.
GGUF_ARCHS = {"llama": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
              "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss", "gemma3_text": "gemma3",
              "phi3": "phi3", "granite": "granite"}
FAMILIES = tuple(GGUF_ARCHS)
# tiny_config's fields changed so that every matmul's input is a multiple of 256 (a K-quant
# group), layer patterns that a GGUF can state (llama.cpp's Gemma 3: every sixth layer
# global; gpt-oss: alternating, sliding first), and 4 experts (2 per token) for speed.
GGUF_SHAPES: dict[str, dict] = {
    "llama": dict(hidden_size=256, intermediate_size=256, head_dim=32),
    "mixtral": dict(hidden_size=256, intermediate_size=256, num_local_experts=4),
    "qwen2": dict(hidden_size=256, intermediate_size=256),
    "qwen3": dict(hidden_size=256, intermediate_size=256, head_dim=32),
    "qwen3_moe": dict(hidden_size=256, intermediate_size=256, moe_intermediate_size=256,
                      head_dim=32, num_experts=4),
    "gpt_oss": dict(hidden_size=256, intermediate_size=256, head_dim=32, num_hidden_layers=2,
                    layer_types=[S, F], num_local_experts=4, num_experts_per_tok=2),
    "gemma3_text": dict(hidden_size=256, intermediate_size=256, head_dim=64,
                        query_pre_attn_scalar=64, num_hidden_layers=6,
                        layer_types=[S] * 5 + [F]),
    "phi3": dict(hidden_size=256, intermediate_size=256, num_attention_heads=8,
                 num_key_value_heads=2,
                 rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                  "partial_rotary_factor": 0.75,
                                  "original_max_position_embeddings": 64,
                                  "short_factor": [1.0, 1.05, 1.1, 1.25, 1.4, 1.5, 1.75, 2.0,
                                                   2.5, 3.0, 3.5, 4.0],
                                  "long_factor": [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0,
                                                  7.0, 8.0, 9.0, 10.0]}),
    "granite": dict(hidden_size=256, intermediate_size=256),
}
QUANTS = ("f16", "q8_0", "q4_k_m", "mxfp4")
MXFP4 = 39  # ggml's type id
_Q6_K_PARTS = ("attn_v", "ffn_down", "ffn_down_exps", "output")  # Q4_K_M's larger type
_EXPERT_PARTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def small_tokenizer(source_dir: Path, out_dir: Path, vocab: int = VOCAB) -> Path:
    """`source_dir`'s byte-level BPE tokenizer (the bundled SmolLM2's) cut to its first
    `vocab` tokens and the merges among them, with its chat template."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (source_dir / name).is_file():
            shutil.copy(source_dir / name, out_dir / name)
    spec = json.loads((source_dir / "tokenizer.json").read_text())
    kept = {t: i for t, i in spec["model"]["vocab"].items() if i < vocab}
    spec["model"]["vocab"] = kept
    spec["model"]["merges"] = [m for m in spec["model"]["merges"]
                               if all(p in kept for p in m) and "".join(m) in kept]
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < vocab]
    (out_dir / "tokenizer.json").write_text(json.dumps(spec))
    return out_dir


def build_gguf_model(kind: str, out_dir: Path, tokenizer_dir: Path) -> Path:
    """tiny_models' random `kind` model, 2 layers deep (Gemma 3: 6), in GGUF_SHAPES'
    widths."""
    from tests.support.tiny_models import build_tiny_model

    return build_tiny_model(kind, out_dir, tokenizer_dir, layers=2, overrides=GGUF_SHAPES[kind])


# -- writing -----------------------------------------------------------------------------

def write_gguf(model_dir: Path, quant: str, path: Path, types: dict[str, int] | None = None
               ) -> dict[str, torch.Tensor]:
    """Write the Hugging Face model at `model_dir` to `path` as llama.cpp's converter would
    (architecture from its config), its matmuls in `quant`: "f16"; "q8_0"; "q4_k_m" (Q4_K,
    Q6_K for the value, down and output projections, as llama.cpp's Q4_K_M mix); "mxfp4"
    (gpt-oss: experts in MXFP4, the rest Q8_0). `types`: another ggml type for some parts
    (`{"ffn_up_exps": Q8_0}`). Returns the expected Hugging Face tensors (float32, as the
    file's blocks dequantize)."""
    import gguf
    from safetensors.torch import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    kind = cfg["model_type"]
    arch = GGUF_ARCHS[kind]
    writer = gguf.GGUFWriter(str(path), arch)
    _write_metadata(writer, kind, cfg)
    _write_tokenizer(writer, model_dir)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[_ARCH_ENUMS[arch]],
                                     cfg["num_hidden_layers"])
    state = load_file(str(model_dir / "model.safetensors"))
    expected: dict[str, torch.Tensor] = {}
    fmt = int(gguf.GGMLQuantizationType.F32)
    stack = torch.empty(0)
    for name, tensor, source in _converted(kind, cfg, state):
        if name is not None:
            gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
            assert gguf_name is not None, name
            fmt = _block_type(gguf_name, tensor, quant, types or {})
            data, raw_dtype = _stored(tensor, fmt)
            writer.add_tensor(gguf_name, data, raw_dtype=raw_dtype)
        if source is None:
            continue
        hf_name, value, input_dim = source
        if isinstance(value, int):  # expert `value` of the stack just reported
            expected[hf_name] = stack[value].contiguous()
        elif hf_name is None:  # a stack: its experts follow
            stack = _round_trip(value, fmt, input_dim)
        else:  # a Hugging Face tensor, stored in the last tensor written
            expected[hf_name] = _round_trip(value, fmt, input_dim)
    for name, tensor in _rope_tensors(kind, cfg):
        writer.add_tensor(name, tensor.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


_ARCH_ENUMS = {"llama": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3", "qwen3moe": "QWEN3MOE",
               "gpt-oss": "GPT_OSS", "gemma3": "GEMMA3", "phi3": "PHI3", "granite": "GRANITE"}


def _write_metadata(writer, kind: str, cfg: dict) -> None:
    """The keys llama.cpp's converter sets for `kind` (TextModel.set_gguf_parameters and
    each family's additions)."""
    from gguf import RopeScalingType

    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    writer.add_name(f"tiny {kind}")
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(rope["rope_theta"])
    if kind == "phi3":  # Phi3MiniModel writes its own set
        rope_dims = int(rope["partial_rotary_factor"] * cfg["hidden_size"]) // heads
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_rope_dimension_count(rope_dims)
        writer.add_sliding_window(cfg.get("sliding_window") or 0)
        scale = cfg["max_position_embeddings"] / rope["original_max_position_embeddings"]
        original = rope["original_max_position_embeddings"]
        writer.add_rope_scaling_attn_factors(np.sqrt(1 + np.log(scale) / np.log(original)))
        return
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    elif rope.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("head_dim") and kind != "granite":  # Granite's converter drops head_dim
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if kind in ("llama", "mixtral", "granite"):
        writer.add_vocab_size(cfg["vocab_size"])
        writer.add_rope_dimension_count(head_dim)
    if kind == "qwen3_moe":
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if kind == "gpt_oss":
        writer.add_sliding_window(cfg["sliding_window"])
        writer.add_expert_feed_forward_length(cfg["intermediate_size"])
    if kind == "gemma3_text":  # (and key_length again, as the base class wrote it)
        writer.add_rope_freq_base_swa(cfg["rope_parameters"]["sliding_attention"]["rope_theta"])
        if cfg.get("final_logit_softcapping"):
            writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        writer.add_sliding_window(cfg["sliding_window"])
    if kind == "granite":
        writer.add_attention_scale(cfg["attention_multiplier"])
        writer.add_embedding_scale(cfg["embedding_multiplier"])
        writer.add_residual_scale(cfg["residual_multiplier"])
        writer.add_logit_scale(cfg["logits_scaling"])


def _write_tokenizer(writer, model_dir: Path) -> None:
    """A byte-level BPE vocabulary as the converter's _set_vocab_gpt2 writes it."""
    from gguf import TokenType

    spec = json.loads((model_dir / "tokenizer.json").read_text())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    vocab = spec["model"]["vocab"]
    special = {t["id"] for t in spec["added_tokens"] if t["special"]}
    tokens = sorted(vocab, key=vocab.__getitem__)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if i in special else TokenType.NORMAL
                            for i in range(len(tokens))])
    writer.add_token_merges([" ".join(m) for m in spec["model"]["merges"]])
    for field, add in (("bos_token", writer.add_bos_token_id),
                       ("eos_token", writer.add_eos_token_id),
                       ("unk_token", writer.add_unk_token_id),
                       ("pad_token", writer.add_pad_token_id)):
        if config.get(field) in vocab:
            add(vocab[config[field]])
    template = model_dir / "chat_template.jinja"
    if template.is_file():
        writer.add_chat_template(template.read_text())


def _converted(kind: str, cfg: dict, state: dict[str, torch.Tensor]):
    """(the converter's name of a tensor to store, the tensor as it stores it, and for each
    Hugging Face tensor, once, with the last stored tensor made from it: (its name, its
    value, its input dimension or None for one kept in F32)); the name is None where only
    a Hugging Face tensor is reported (an expert of a stack already stored)."""
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    experts: dict[tuple[int, str], list[torch.Tensor]] = {}
    n_experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    for name, w in state.items():
        w = w.float()
        hf = (name, w, w.dim() - 1 if w.dim() > 1 else None)
        if kind in ("llama", "mixtral", "granite"):  # LlamaModel.permute
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                w = _permute(w, heads)
            elif name.endswith(("k_proj.weight", "k_proj.bias")):
                w = _permute(w, kv_heads)
        if kind == "gemma3_text" and name.endswith("norm.weight"):
            w = w + 1.0
            yield name, w, (name, w - 1.0, None)
            continue
        if kind == "gpt_oss" and ".mlp.experts." in name:
            yield from _gpt_oss_experts(name, w)
            continue
        if kind == "gpt_oss" and name.endswith("self_attn.sinks"):
            yield name + ".weight", w, (name, w, None)
            continue
        if ".experts." in name and kind in ("qwen3_moe", "mixtral"):  # stacked per layer
            parts = name.split(".")
            layer, proj = int(parts[2]), parts[-2]
            bucket = experts.setdefault((layer, proj), [])
            bucket.append((int(parts[-3]), name, w))
            if len(bucket) == n_experts:
                bucket.sort(key=lambda b: b[0])
                stacked = torch.stack([t for _, _, t in bucket])
                merged = (f"layers.{layer}.feed_forward.experts.{proj}" if kind == "mixtral"
                          else f"model.layers.{layer}.mlp.experts.{proj}")
                # The stack's round trip, one expert at a time.
                yield merged + ".weight", stacked, (None, stacked, 2)
                for e, ename, _ in bucket:
                    yield None, None, (ename, e, None)
            continue
        yield name, w, hf


def _gpt_oss_experts(name: str, w: torch.Tensor):
    """GptOssModel.modify_tensors for the unquantized checkpoint: gate_up_proj [E, H, 2I]
    transposed and split into its interleaved gate and up rows; down_proj transposed."""
    base = name.rsplit(".", 1)[0] + "."  # model.layers.N.mlp.experts.
    if name.endswith("gate_up_proj_bias"):
        yield base + "gate_proj.bias", w[..., ::2], None
        yield base + "up_proj.bias", w[..., 1::2], (name, w, None)
    elif name.endswith("gate_up_proj"):
        t = w.transpose(-1, -2)
        yield base + "gate_proj.weight", t[:, ::2].contiguous(), None
        yield base + "up_proj.weight", t[:, 1::2].contiguous(), (name, w, 1)
    elif name.endswith("down_proj_bias"):
        yield base + "down_proj.bias", w, (name, w, None)
    else:
        yield base + "down_proj.weight", w.transpose(-1, -2).contiguous(), (name, w, 1)


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def _rope_tensors(kind: str, cfg: dict):
    """The rotary settings the converter stores as tensors: Llama 3's factors
    (LlamaModel.generate_extra_tensors), LongRoPE's (Phi3MiniModel's)."""
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type") == "llama3":
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2).float() / head_dim))
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old = rope["original_max_position_embeddings"]
        factors = []
        for freq in freqs:  # in float32, as the converter computes them
            wavelength = 2 * np.pi / freq
            if wavelength < old / high:
                factors.append(1.0)
            elif wavelength > old / low:
                factors.append(factor)
            else:
                smooth = (old / wavelength - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        yield "rope_freqs.weight", torch.tensor(factors, dtype=torch.float32)
    if rope.get("rope_type") == "longrope":
        yield "rope_factors_long.weight", torch.tensor(rope["long_factor"], dtype=torch.float32)
        yield "rope_factors_short.weight", torch.tensor(rope["short_factor"],
                                                        dtype=torch.float32)


def _block_type(gguf_name: str, tensor: torch.Tensor, quant: str, types: dict[str, int]
                ) -> int:
    """The ggml type `quant` stores this tensor in: vectors, norms and routers in F32 (as
    llama.cpp keeps them), matmuls per the mix or `types`."""
    import gguf

    part = gguf_name.split(".")[-2]
    if tensor.dim() < 2 or part == "ffn_gate_inp" or gguf_name.endswith(".bias"):
        return int(gguf.GGMLQuantizationType.F32)
    if part in types:
        return types[part]
    if quant == "f16":
        return int(gguf.GGMLQuantizationType.F16)
    if quant == "q8_0" or (quant == "mxfp4" and part not in _EXPERT_PARTS):
        return qr.Q8_0
    if quant == "mxfp4":
        return MXFP4
    assert quant == "q4_k_m", quant
    return qr.Q6_K if part in _Q6_K_PARTS else qr.Q4_K


def _stored(tensor: torch.Tensor, fmt: int) -> tuple[np.ndarray, object]:
    """add_tensor's data and raw_dtype for `tensor` in type `fmt`."""
    import gguf

    if fmt == gguf.GGMLQuantizationType.F32:
        return tensor.contiguous().numpy(), None
    if fmt == gguf.GGMLQuantizationType.F16:
        return tensor.contiguous().numpy().astype(np.float16), None
    return _quantize(tensor, fmt), gguf.GGMLQuantizationType(fmt)


def _quantize(tensor: torch.Tensor, fmt: int) -> np.ndarray:
    """Rows of blocks [..., bytes] (our quantizers where we have one, else gguf-py's)."""
    import gguf

    rows = tensor.reshape(-1, tensor.shape[-1]).contiguous()
    if fmt in qr.QUANTIZERS:
        data = qr.QUANTIZERS[fmt](rows).numpy()
    else:
        data = gguf.quants.quantize(rows.numpy(), gguf.GGMLQuantizationType(fmt))
    return data.reshape(*tensor.shape[:-1], -1)


def _round_trip(tensor: torch.Tensor, fmt: int, input_dim: int | None) -> torch.Tensor:
    """`tensor` with each row along `input_dim` stored in `fmt` and read back."""
    import gguf

    if input_dim is None or fmt == gguf.GGMLQuantizationType.F32:
        return tensor.clone()
    moved = tensor.movedim(input_dim, -1).contiguous()
    if fmt == gguf.GGMLQuantizationType.F16:
        back = moved.half().float()
    else:
        data = _quantize(moved, fmt)
        values = gguf.quants.dequantize(data.reshape(-1, data.shape[-1]),
                                        gguf.GGMLQuantizationType(fmt))
        back = torch.from_numpy(np.ascontiguousarray(values)).reshape(moved.shape)
    return back.movedim(-1, input_dim).contiguous()


def write_reference_dir(model_dir: Path, expected: dict[str, torch.Tensor], out: Path) -> Path:
    """`model_dir` with its weights replaced by `expected` (what the GGUF holds)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    save_file({k: v.contiguous() for k, v in expected.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out
