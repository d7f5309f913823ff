"""One decoder-only transformer for Llama, Mistral, SmolLM, Qwen2 and Qwen3.

Weights are fused at load time (q/k/v into one matrix, gate/up into another) so a layer is
four matmuls. The forward pass takes flat token batches (no padding): attention over the
paged KV cache is delegated to an attention backend that reads per-step metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from engine.model_spec import ModelSpec
from engine.models.rotary import RotaryTable


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, dtype: torch.dtype) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.q_size = spec.num_heads * d
        self.kv_size = spec.num_kv_heads * d
        e = dict(dtype=dtype)
        self.input_norm = nn.Parameter(torch.ones(h, **e), requires_grad=False)
        self.post_attn_norm = nn.Parameter(torch.ones(h, **e), requires_grad=False)
        self.qkv = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=spec.qkv_bias, **e)
        self.o_proj = nn.Linear(self.q_size, h, bias=spec.o_bias, **e)
        self.gate_up = nn.Linear(h, 2 * spec.intermediate_size, bias=spec.mlp_bias, **e)
        self.down = nn.Linear(spec.intermediate_size, h, bias=spec.mlp_bias, **e)
        if spec.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(d, **e), requires_grad=False)
            self.k_norm = nn.Parameter(torch.ones(d, **e), requires_grad=False)
        else:
            self.q_norm = self.k_norm = None


class DecoderModel(nn.Module):
    """The whole model: embeddings, layers, final norm, LM head."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, ops: Any) -> None:
        super().__init__()
        self.spec = spec
        self.ops = ops
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(spec, dtype) for _ in range(spec.num_layers))
        self.norm = nn.Parameter(torch.ones(spec.hidden_size, dtype=dtype), requires_grad=False)
        if spec.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, dtype=dtype)
        self.requires_grad_(False)
        self.rotary: RotaryTable | None = None

    def init_rotary(self, max_positions: int) -> None:
        self.rotary = RotaryTable(self.spec, max_positions, self.embed.weight.device)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors, fusing q/k/v and gate/up as they arrive."""
        pending: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        seen: set[str] = set()
        fused = {
            "self_attn.q_proj": ("qkv", "q"), "self_attn.k_proj": ("qkv", "k"),
            "self_attn.v_proj": ("qkv", "v"), "mlp.gate_proj": ("gate_up", "g"),
            "mlp.up_proj": ("gate_up", "u"),
        }
        order = {"qkv": ("q", "k", "v"), "gate_up": ("g", "u")}
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if name.startswith("layers."):
                _, idx, rest = name.split(".", 2)
                layer = self.layers[int(idx)]
                module_name, kind = rest.rsplit(".", 1)
                if module_name in fused:
                    target, part = fused[module_name]
                    key = (int(idx), f"{target}.{kind}")
                    pending.setdefault(key, {})[part] = tensor
                    if len(pending[key]) == len(order[target]):
                        parts = pending.pop(key)
                        cat = torch.cat([parts[p] for p in order[target]], dim=0)
                        self._copy(getattr(layer, target), kind, cat, f"layers.{idx}.{target}")
                        seen.add(f"layers.{idx}.{target}.{kind}")
                    continue
                simple = {
                    "input_layernorm.weight": (layer, "input_norm"),
                    "post_attention_layernorm.weight": (layer, "post_attn_norm"),
                    "self_attn.q_norm.weight": (layer, "q_norm"),
                    "self_attn.k_norm.weight": (layer, "k_norm"),
                    "self_attn.o_proj.weight": (layer.o_proj, "weight"),
                    "self_attn.o_proj.bias": (layer.o_proj, "bias"),
                    "mlp.down_proj.weight": (layer.down, "weight"),
                    "mlp.down_proj.bias": (layer.down, "bias"),
                }
                if rest not in simple:
                    if "rotary_emb" in rest:
                        continue
                    raise ValueError(f"Unexpected weight {name!r} in checkpoint.")
                obj, attr = simple[rest]
                self._copy(obj, attr, tensor, name)
                seen.add(name)
            elif name == "embed_tokens.weight":
                self._copy(self.embed, "weight", tensor, name)
                seen.add(name)
            elif name == "norm.weight":
                self._copy(self, "norm", tensor, name)
                seen.add(name)
            elif name == "lm_head.weight":
                if self.lm_head is not None:
                    self._copy(self.lm_head, "weight", tensor, name)
                    seen.add(name)
            else:
                raise ValueError(f"Unexpected weight {name!r} in checkpoint.")
        if pending:
            raise ValueError(f"Incomplete fused weights in checkpoint: {sorted(pending)}")
        expected = 2 + (self.lm_head is not None) + self.spec.num_layers * (
            6 + 2 * self.spec.qk_norm + self.spec.qkv_bias + self.spec.o_bias
            + 2 * self.spec.mlp_bias
        )
        if len(seen) != expected:
            raise ValueError(
                f"Checkpoint holds {len(seen)} of the {expected} expected weights; "
                "is it the right architecture?"
            )

    @staticmethod
    def _copy(obj: Any, attr: str, tensor: torch.Tensor, name: str) -> None:
        param = getattr(obj, attr)
        if param is None or param.shape != tensor.shape:
            shape = None if param is None else tuple(param.shape)
            raise ValueError(f"Weight {name!r}: checkpoint {tuple(tensor.shape)} vs model {shape}")
        param.data.copy_(tensor.to(param.dtype))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: Any,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Run flat tokens [T] through the model; return logits (float32) at logits_indices."""
        ops, spec = self.ops, self.spec
        d, hq, hk, eps = spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.rms_norm_eps
        assert self.rotary is not None, "init_rotary() first"
        cos, sin = self.rotary.lookup(positions)
        x = self.embed(input_ids)
        residual = None
        for i, layer in enumerate(self.layers):
            if residual is None:
                residual = x
                h = ops.rms_norm(x, layer.input_norm, eps)
            else:
                h, residual = ops.fused_add_rms_norm(x, residual, layer.input_norm, eps)
            qkv = layer.qkv(h)
            q, k, v = qkv.split([layer.q_size, layer.kv_size, layer.kv_size], dim=-1)
            q = q.view(-1, hq, d)
            k = k.view(-1, hk, d)
            v = v.view(-1, hk, d)
            if layer.q_norm is not None:
                q = ops.rms_norm(q, layer.q_norm, eps)
                k = ops.rms_norm(k, layer.k_norm, eps)
            q, k = ops.apply_rotary(q, k, cos, sin)
            o = attention.forward(i, q, k, v)
            x = layer.o_proj(o.reshape(-1, hq * d))
            h, residual = ops.fused_add_rms_norm(x, residual, layer.post_attn_norm, eps)
            x = layer.down(ops.silu_and_mul(layer.gate_up(h)))
        h, _ = ops.fused_add_rms_norm(x, residual, self.norm, eps)
        h = h.index_select(0, logits_indices)
        return torch.nn.functional.linear(h, self.lm_head_weight).float()
