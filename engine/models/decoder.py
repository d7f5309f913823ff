"""One decoder-only transformer for Llama, Mistral, SmolLM, Qwen2 and Qwen3.

Weights are fused at load time (q/k/v into one matrix, gate/up into another) so a layer is
four matmuls. The forward pass takes flat token batches (no padding): attention over the
paged KV cache is delegated to an attention backend that reads per-step metadata.

Under tensor parallelism each rank builds the same model over its ShardPlan: its heads,
its intermediate range, its vocabulary rows, and loads only those slices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from officellm.engine.distributed.parallel_state import ParallelState
from officellm.engine.loading.gguf_tensors import QuantizedTensor
from officellm.engine.loading.model_spec import ModelSpec
from officellm.engine.models import packed_linear
from officellm.engine.models.fixed_order_linear import FixedOrderWeight
from officellm.engine.models.parallel_linear import ColumnParallelLinear, RowParallelLinear
from officellm.engine.models.quantized_linear import QuantizedWeight, QuantMatmul, QuantPack
from officellm.engine.models.rotary import RotaryTable
from officellm.engine.models.shard_plan import ShardPlan
from officellm.engine.models.vocab_parallel import ParallelLMHead, VocabParallelEmbedding


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, dtype: torch.dtype, plan: ShardPlan,
                 parallel: ParallelState) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.num_heads = plan.num_q_heads
        self.num_kv_heads = plan.num_kv_heads
        self.q_size = self.num_heads * d
        self.kv_size = self.num_kv_heads * d
        inter = len(plan.intermediate)
        e = dict(dtype=dtype)
        self.input_norm = nn.Parameter(torch.ones(h, **e), requires_grad=False)
        self.post_attn_norm = nn.Parameter(torch.ones(h, **e), requires_grad=False)
        self.qkv = ColumnParallelLinear(h, self.q_size + 2 * self.kv_size, spec.qkv_bias, dtype)
        self.o_proj = RowParallelLinear(self.q_size, h, spec.o_bias, dtype, parallel)
        self.gate_up = ColumnParallelLinear(h, 2 * inter, spec.mlp_bias, dtype)
        self.down = RowParallelLinear(inter, h, spec.mlp_bias, dtype, parallel)
        if spec.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(d, **e), requires_grad=False)
            self.k_norm = nn.Parameter(torch.ones(d, **e), requires_grad=False)
        else:
            self.q_norm = self.k_norm = None


def runs_dense(module: ColumnParallelLinear | RowParallelLinear | ParallelLMHead) -> bool:
    """Whether some batch runs a layer over its dense weight (so it is worth packing)."""
    return module.quantized is None or module.quantized.max_rows is not None


class DecoderModel(nn.Module):
    """The whole model: embeddings, layers, final norm, LM head."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, ops: Any,
                 parallel: ParallelState | None = None) -> None:
        super().__init__()
        parallel = parallel or ParallelState()
        self.spec = spec
        self.ops = ops
        self.parallel = parallel
        self.plan = ShardPlan.for_rank(spec, parallel.rank, parallel.world_size)
        h = spec.hidden_size
        self.embed = VocabParallelEmbedding(self.plan, h, dtype, parallel)
        self.layers = nn.ModuleList(DecoderLayer(spec, dtype, self.plan, parallel)
                                    for _ in range(spec.num_layers))
        self.norm = nn.Parameter(torch.ones(h, dtype=dtype), requires_grad=False)
        self.lm_head = ParallelLMHead(self.plan, h, spec.vocab_size, dtype, parallel,
                                      tied=self.embed if spec.tie_word_embeddings else None)
        self.requires_grad_(False)
        self.rotary: RotaryTable | None = None

    def init_rotary(self, max_positions: int) -> None:
        self.rotary = RotaryTable(self.spec, self.spec.layer_rope(0), max_positions,
                                  self.embed.weight.device)

    def weight_bytes(self) -> int:
        """Bytes of every weight this rank holds, dense or in blocks."""
        dense = sum(p.numel() * p.element_size() for p in self.parameters())
        modules = [self.embed, self.lm_head, *(m for layer in self.layers for m in (
            layer.qkv, layer.o_proj, layer.gate_up, layer.down))]
        # A tied head reads the embedding's blocks: count each tensor once.
        blocks = {g.data.data_ptr(): g.data.numel() for m in modules if m.quantized is not None
                  for g in m.quantized.groups}
        return dense + sum(blocks.values())

    def pack_linears(self, prepare: Callable[[torch.Tensor], torch.Tensor | FixedOrderWeight]
                     = packed_linear.pack) -> int:
        """Prepare every dense matmul weight for its kernel: oneDNN's packing (bf16 on the CPU;
        see packed_linear.py) by default, or `prepare`'s (the batch-invariant kernel's
        FixedOrderWeight).

        Call after load_weights. The plain weights of the layers are released (nothing reads
        them any more); the embedding keeps its own for the lookup. Returns how many prepared.
        """
        modules = [m for layer in self.layers for m in (layer.qkv, layer.o_proj, layer.gate_up,
                                                        layer.down) if runs_dense(m)]
        for module in modules:
            module.packed = prepare(module.weight)
            module.weight.data = torch.empty(0, dtype=module.weight.dtype)
        head = self.lm_head
        if not runs_dense(head):
            return len(modules)
        head.packed = prepare(head.tied.weight if head.tied is not None else head.weight)
        if head.weight is not None:
            head.weight.data = torch.empty(0, dtype=head.weight.dtype)
        return len(modules) + 1

    def layer_matmuls(self) -> Iterator[tuple[ColumnParallelLinear | RowParallelLinear,
                                               tuple[str, ...]]]:
        """Each layer's matmuls in order, with the Hugging Face names of the weights fused
        into each."""
        for i, layer in enumerate(self.layers):
            parts = {
                layer.qkv: ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                layer.o_proj: ("self_attn.o_proj",),
                layer.gate_up: ("mlp.gate_proj", "mlp.up_proj"),
                layer.down: ("mlp.down_proj",),
            }
            for module, names in parts.items():
                yield module, tuple(f"model.layers.{i}.{n}.weight" for n in names)

    def keep_quantized(self, tensors: dict[str, QuantizedTensor], matmul: QuantMatmul,
                       max_rows: int | None = None, pack: QuantPack | None = None) -> int:
        """Run the matmuls whose weights `tensors` hold (Hugging Face names) over their
        blocks, and release those dense weights; one rank only. A fused weight is kept in
        blocks only when all its parts are. `max_rows`: blocks only for batches of up to
        that many rows, the dense weights kept for larger ones (the embedding lookup then
        reads the dense table). `pack`: the matmuls' layout (a tied table is packed once
        and read by both the head and the lookup). Call after load_weights; returns how many modules now read blocks."""
        assert self.parallel.world_size == 1, "blocks are not split across ranks"
        kept = 0
        for module, names in self.layer_matmuls():
            found = [tensors.get(n) for n in names]
            if all(t is not None for t in found):
                module.quantized = QuantizedWeight.fuse(
                    found, matmul, max_rows, pack)  # type: ignore[arg-type]
                if max_rows is None:
                    module.weight.data = torch.empty(0, dtype=module.weight.dtype)
                kept += 1
        table = tensors.get("model.embed_tokens.weight")
        if table is not None and pack is not None and self.lm_head.tied is not None:
            # The tied head and the lookup share one copy, in the matmul's layout.
            table = QuantizedTensor(table.fmt, pack(table.data, table.fmt), table.in_features)
            pack = None
        head = tensors.get("lm_head.weight") if self.lm_head.tied is None else table
        if head is not None:
            self.lm_head.quantized = QuantizedWeight.fuse([head], matmul, max_rows, pack)
            if self.lm_head.weight is not None and max_rows is None:
                self.lm_head.weight.data = torch.empty(0, dtype=self.lm_head.weight.dtype)
            kept += 1
        if table is not None and max_rows is None:
            self.embed.quantized = QuantizedWeight.fuse([table], matmul)
            self.embed.weight.data = torch.empty(0, dtype=self.embed.weight.dtype)
            kept += 1
        return kept

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors, fusing q/k/v and gate/up as they arrive; under
        tensor parallelism each tensor is cut to this rank's slice first."""
        plan = self.plan
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
                tensor = plan.shard(rest, tensor)
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
                self._copy(self.embed, "weight", plan.shard("embed_tokens.weight", tensor), name)
                seen.add(name)
            elif name == "norm.weight":
                self._copy(self, "norm", tensor, name)
                seen.add(name)
            elif name == "lm_head.weight":
                if self.lm_head.weight is not None:
                    self._copy(self.lm_head, "weight", plan.shard(name, tensor), name)
                    seen.add(name)
            else:
                raise ValueError(f"Unexpected weight {name!r} in checkpoint.")
        if pending:
            raise ValueError(f"Incomplete fused weights in checkpoint: {sorted(pending)}")
        expected = 2 + (self.lm_head.weight is not None) + self.spec.num_layers * (
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
    ) -> torch.Tensor | None:
        """Run flat tokens [T] through the model; return logits (float32) at logits_indices
        (on rank 0; None on the other tensor-parallel ranks)."""
        return self.lm_head(self.hidden_states(input_ids, positions, attention, logits_indices))

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Any,
                      indices: torch.Tensor) -> torch.Tensor:
        """The final norm's output at `indices` of the flat tokens [T]: what the LM head
        reads, and what a decoder embedding model pools."""
        ops, spec = self.ops, self.spec
        d, eps = spec.head_dim, spec.rms_norm_eps
        hq, hk = self.plan.num_q_heads, self.plan.num_kv_heads
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
            # The backend rotates q/k as it stores k/v (one kernel on the GPU).
            o = attention.forward(i, q, k, v, cos, sin)
            x = layer.o_proj(o.reshape(-1, hq * d))
            h, residual = ops.fused_add_rms_norm(x, residual, layer.post_attn_norm, eps)
            x = layer.down(ops.silu_and_mul(layer.gate_up(h)))
        h, _ = ops.fused_add_rms_norm(x, residual, self.norm, eps)
        return h.index_select(0, indices)
