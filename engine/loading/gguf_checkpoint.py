"""A GGUF file as a Hugging Face model: its config (gguf_config.py), tokenizer and tensors,
dequantized, under the names and in the layout of the family's own checkpoints, with what
llama.cpp's converter did undone (gguf_names.py says what). The engine reads the tensors
as it loads (model_loader.iter_weights); a whole checkpoint on disk is written only for
transformers (write_hf_checkpoint: tests and benchmarks).

Stacked experts are laid out as each family's checkpoints hold them: Qwen3-MoE's and
Mixtral's one tensor per expert and projection, gpt-oss's fused gate_up_proj [E, H, 2I] with
gate and up interleaved (and its biases so). Every block type is dequantized by gguf-py's
NumPy dequantization as the tensor is read (equal to kernels/reference/quant_reference.py's
for the types with a kernel, and 8x faster than it on the CPU).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from officellm.engine.loading.gguf_config import hf_config, model_type_of
from officellm.engine.loading.gguf_layout import GgufLayout, GgufTensorInfo, read_layout
from officellm.engine.loading.gguf_names import (
    TensorPlace,
    permuted_heads,
    tensor_place,
    unpermute_rows,
)
from officellm.engine.loading.gguf_tensors import expert_layers_in_blocks
from officellm.engine.loading.transformers_lock import TRANSFORMERS

logger = logging.getLogger("officellm.engine.loading.gguf_checkpoint")

SHARD_BYTES = 2 * 1024**3  # float32 bytes per safetensors file
# Per family: the per-expert names of (gate, up, down), or None for gpt-oss's fused layout.
_EXPERT_NAMES = {"qwen3_moe": ("mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj",
                               "mlp.experts.{e}.down_proj"),
                 "mixtral": ("block_sparse_moe.experts.{e}.w1", "block_sparse_moe.experts.{e}.w3",
                             "block_sparse_moe.experts.{e}.w2")}
_GATE, _UP, _DOWN = "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"


def dequantized(layout: GgufLayout, info: GgufTensorInfo) -> torch.Tensor:
    """The tensor's float32 values, in torch's dimension order (GGUF's reversed)."""
    import gguf

    shape = tuple(reversed(info.shape))
    raw = layout.tensor_bytes(info).reshape(int(np.prod(shape[:-1], dtype=np.int64)), -1)
    values = gguf.quants.dequantize(raw, info.tensor_type)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(shape)


def hf_tensors(layout: GgufLayout, config: dict[str, Any], skip_block_experts: bool = False,
               skip: Collection[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, float32 tensor) for every weight of the GGUF, in `config`'s family's
    checkpoint layout (config: hf_config's). `skip_block_experts`: leave out the experts
    the engine reads from the file's blocks (gguf_tensors.expert_layers_in_blocks; their
    biases stay); `skip`: leave out these (non-expert) names, neither read nor
    dequantized."""
    model_type = config["model_type"]
    arch = str(layout.metadata["general.architecture"])
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    fused = _FusedExperts() if model_type == "gpt_oss" else None
    skipped = expert_layers_in_blocks(layout, model_type) if skip_block_experts else set()
    for info in layout.tensors:
        place = tensor_place(model_type, info.name)
        if place is None:
            continue
        if place.is_experts and place.kind == "weight" and place.layer in skipped:
            continue
        if not place.is_experts and place.name in skip:
            continue
        tensor = dequantized(layout, info)
        if place.is_experts:
            if fused is not None:
                yield from fused.add(place, tensor)
            else:
                yield from _per_expert(model_type, place, tensor)
            continue
        permuted = permuted_heads(arch, place.part, heads, kv_heads)
        if permuted is not None:
            tensor = tensor[unpermute_rows(tensor.shape[0], permuted)]
        if model_type == "gemma3_text" and place.part.endswith("norm"):
            tensor = tensor - 1.0  # the converter stored Gemma's 1 + w
        yield place.name, tensor.contiguous()
    if fused is not None:
        fused.check_done()


def _per_expert(model_type: str, place: TensorPlace, stacked: torch.Tensor
                ) -> Iterator[tuple[str, torch.Tensor]]:
    if place.kind != "weight" or model_type not in _EXPERT_NAMES:
        raise ValueError(f"Unexpected experts tensor {place.part}.{place.kind} in a "
                         f"{model_type} GGUF.")
    names = dict(zip((_GATE, _UP, _DOWN), _EXPERT_NAMES[model_type]))
    for e in range(stacked.shape[0]):
        yield f"{place.name}{names[place.part].format(e=e)}.weight", stacked[e].contiguous()


class _FusedExperts:
    """gpt-oss's experts: gate and up (and their biases) interleaved into one tensor once
    both of a layer have been read; down transposed to [E, I, H]."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, str], torch.Tensor] = {}

    def add(self, place: TensorPlace, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        if place.part == _DOWN:
            if place.kind == "weight":
                yield f"{place.name}mlp.experts.down_proj", tensor.transpose(1, 2).contiguous()
            else:
                yield f"{place.name}mlp.experts.down_proj_bias", tensor
            return
        self.pending[(place.name + place.kind, place.part)] = tensor
        other = _UP if place.part == _GATE else _GATE
        partner = self.pending.get((place.name + place.kind, other))
        if partner is None:
            return
        gate, up = (tensor, partner) if place.part == _GATE else (partner, tensor)
        del self.pending[(place.name + place.kind, _GATE)]
        del self.pending[(place.name + place.kind, _UP)]
        both = torch.stack([gate, up], dim=2).flatten(1, 2)  # rows g0, u0, g1, u1, ...
        if place.kind == "weight":
            yield f"{place.name}mlp.experts.gate_up_proj", both.transpose(1, 2).contiguous()
        else:
            yield f"{place.name}mlp.experts.gate_up_proj_bias", both.contiguous()

    def check_done(self) -> None:
        if self.pending:
            raise ValueError(f"gpt-oss GGUF with unpaired expert tensors: "
                             f"{sorted(k for k, _ in self.pending)}")


def write_hf_description(path: Path, target: Path) -> None:
    """Describe the GGUF at `path` in the empty directory `target` as a Hugging Face model
    without its weights (the engine reads them from the file): config.json, the tokenizer
    (with the file's chat template) and generation_config.json."""
    layout = read_layout(path)
    model_type_of(layout)  # an unsupported architecture is refused before any work
    (target / "config.json").write_text(json.dumps(hf_config(layout), indent=2))
    tokenizer = gguf_tokenizer(path)
    tokenizer.save_pretrained(str(target))
    (target / "generation_config.json").write_text(json.dumps(
        _generation_config(layout, tokenizer), indent=2))


def write_hf_checkpoint(path: Path, target: Path) -> None:
    """Write the GGUF at `path` into the empty directory `target` as a whole Hugging Face
    checkpoint: its description and every weight as float32 safetensors (the model as
    written, for transformers: the parity tests' and the fidelity benchmark's reference;
    the engine never needs it)."""
    from safetensors.torch import save_file

    write_hf_description(path, target)
    layout = read_layout(path)
    shard: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}
    files: list[str] = []

    def flush() -> None:
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, str(target / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        files.append(name)
        shard.clear()

    size = 0
    for name, tensor in hf_tensors(layout, hf_config(layout)):
        if shard and size + tensor.numel() * 4 > SHARD_BYTES:
            flush()
            size = 0
        shard[name] = tensor.float()
        size += tensor.numel() * 4
    if shard:
        flush()
    (target / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(t.stat().st_size for t in target.glob("*.safetensors"))},
         "weight_map": weight_map}, indent=2))


def gguf_tokenizer(path: Path) -> Any:
    """The GGUF's tokenizer and chat template, through transformers' conversion of GGUF
    tokenizers (byte-level BPE, SentencePiece, Gemma's and Phi-3's), built without the
    model's config (which transformers cannot read for every architecture) and without the
    files beside it (from_pretrained would prefer a tokenizer.json in the same folder)."""
    with TRANSFORMERS:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(name_or_path=str(path.parent), gguf_file=path.name)


def _generation_config(layout: GgufLayout, tokenizer: Any) -> dict[str, Any]:
    """End-of-generation ids as llama.cpp counts them: EOS, end-of-turn and end-of-message."""
    meta = layout.metadata
    ids = {int(meta[f"tokenizer.ggml.{key}"]) for key in  # type: ignore[call-overload]
           ("eos_token_id", "eot_token_id", "eom_token_id") if f"tokenizer.ggml.{key}" in meta}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen: dict[str, Any] = {"eos_token_id": sorted(ids) if len(ids) > 1 else next(iter(ids), None)}
    if "tokenizer.ggml.bos_token_id" in meta:
        gen["bos_token_id"] = int(meta["tokenizer.ggml.bos_token_id"])  # type: ignore[call-overload]
    return gen
