"""A decoder embedding model (Qwen3-Embedding and its kind) on the engine's own model code:
the same DecoderModel, weights and kernels as generation, run over a batch of whole inputs
with plain causal attention (no KV cache: each input is read once), the last token's final
hidden state pooled and normalised.

The engine runs it when a model directory is one of its decoder architectures and pools the
last token (sentence-transformers' `pooling_mode_lasttoken`, or no sentence-transformers
modules at all); sentence-transformers runs the rest (engine/embedding/encoders.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from officellm.engine.attention import selection
from officellm.engine.embedding.locked_tokenizer import LockedTokenizer
from officellm.engine.embedding.sentence_encoder import EncoderInfo, matryoshka_dimensions
from officellm.engine.loading.model_loader import iter_weights, load_config_dict
from officellm.engine.loading.model_spec import ModelSpec
from officellm.engine.loading.tokenizer import load_tokenizer
from officellm.engine.models.decoder import DecoderModel
from officellm.kernels.ops import ApplyRotary

# The longest input read: attention over a whole input is computed at once, and a decoder's
# own context (32k for Qwen3-Embedding) is more than an embedding of a document chunk needs.
MAX_INPUT_TOKENS = 8192


class DenseCausalAttention:
    """The attention DecoderModel calls, over flat tokens of whole sequences (`starts`: each
    sequence's first token, then the total): q/k rotated by `rotary` (the model's
    KernelOps.apply_rotary), then causal within each sequence, nothing cached."""

    def __init__(self, starts: list[int], scale: float, rotary: ApplyRotary) -> None:
        self.starts = starts
        self.scale = scale
        self.rotary = rotary

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k = self.rotary(q, k, cos, sin)
        out = torch.empty_like(q)
        groups = q.shape[1] // k.shape[1]
        for a, b in zip(self.starts, self.starts[1:], strict=False):
            qs = q[a:b].transpose(0, 1)  # [heads, L, d]
            ks = k[a:b].transpose(0, 1).repeat_interleave(groups, dim=0)
            vs = v[a:b].transpose(0, 1).repeat_interleave(groups, dim=0)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=self.scale)
            out[a:b] = o.transpose(0, 1)
        return out


def pools_last_token(model_dir: Path) -> bool:
    """Whether the model's sentence-transformers pooling is its last token (True for a
    directory without sentence-transformers modules: a decoder embedder's convention)."""
    pooling = model_dir / "1_Pooling" / "config.json"
    if not (model_dir / "modules.json").is_file():
        return True
    if not pooling.is_file():
        return False
    return bool(json.loads(pooling.read_text()).get("pooling_mode_lasttoken"))


def _normalizes(model_dir: Path) -> bool:
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return True  # Qwen3-Embedding's usage normalises; a bare decoder directory likewise
    return any(m.get("type", "").endswith("Normalize")
               for m in json.loads(modules.read_text()))


class DecoderEncoder:
    """One decoder embedding model directory on `device` (default: the first GPU if torch
    sees one, else the CPU), in float32 on the CPU and bfloat16 on a GPU."""

    def __init__(self, model_dir: str | Path, device: str | None = None) -> None:
        self.model_dir = Path(model_dir)
        spec = ModelSpec.from_config_dict(load_config_dict(self.model_dir))
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        model = DecoderModel(spec, dtype, selection.ops_for(self.device))
        model.lm_head.weight = None  # an embedder reads hidden states, never logits
        model.to(self.device)
        model.load_weights(iter_weights(self.model_dir))
        limit = min(spec.max_position_embeddings, MAX_INPUT_TOKENS)
        model.init_rotary(limit + 1)
        model.eval()
        self.model, self.spec = model, spec
        self.tokenizer = LockedTokenizer(load_tokenizer(self.model_dir))
        self.info = EncoderInfo(dimensions=spec.hidden_size, max_input_tokens=limit,
                                matryoshka_dimensions=matryoshka_dimensions(
                                    self.model_dir, spec.hidden_size),
                                normalized=_normalizes(self.model_dir),
                                vocab_size=spec.vocab_size)

    def tokenize(self, text: str, max_length: int | None = None) -> list[int]:
        """The model's ids for `text` (LockedTokenizer.tokenize)."""
        return self.tokenizer.tokenize(text, max_length)

    def close(self) -> None:
        """Nothing outlives the object: the model is freed with it."""

    def watch(self, died: Callable[[str], None]) -> None:
        """It runs in this process: it never stops untold."""

    @torch.inference_mode()
    def encode(self, batch: list[list[int]]) -> torch.Tensor:
        """One float32 vector per input: its last token's final hidden state, normalised
        if the model's vectors are; inputs side by side, none padded."""
        starts = [0]
        for ids in batch:
            starts.append(starts[-1] + len(ids))
        flat = torch.tensor([t for ids in batch for t in ids], device=self.device)
        positions = torch.cat([torch.arange(len(ids), device=self.device) for ids in batch])
        last = torch.tensor([s - 1 for s in starts[1:]], device=self.device)
        attention = DenseCausalAttention(starts, self.spec.scale,
                                         self.model.ops.apply_rotary)
        h = self.model.hidden_states(flat, positions, attention, last).float()
        if self.info.normalized:
            h = F.normalize(h, dim=-1)
        return h.cpu()

