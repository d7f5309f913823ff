"""One decoder-only transformer for every family officellm runs (engine/loading/model_spec.py
lists them and the features each turns on).

Weights are fused at load time (q/k/v into one matrix, gate/up into another) so a dense layer
is four matmuls; a mixture-of-experts layer's MLP is engine/models/moe.py. The forward pass
takes flat token batches (no padding): attention over the paged KV cache is delegated to an
attention backend that reads per-step metadata, each layer with its window and sinks.

What the families change, as features of the one layer:
- norms: pre-norm (Llama) or Gemma 3's sandwich (a norm on the attention's and the MLP's
  outputs too); Gemma's norms multiply by 1 + w, stored as such at load;
- the MLP's gated activation (SwiGLU, GeGLU) or a mixture of experts;
- multipliers: embeddings times sqrt(hidden) (Gemma) or a multiplier, residual branches
  scaled, the attention's scale, logits divided (Granite) or soft-capped;
- q/k norms, q/k/v/o biases, attention sinks (gpt-oss), partial rotary (Phi-4-mini), a
  rotary table per layer type (Gemma 3's sliding layers).

Under tensor parallelism each rank builds the same model over its ShardPlan: its heads,
its intermediate range (every expert's), its vocabulary rows, and loads only those slices.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from officellm.engine.attention.backend import LayerAttention
from officellm.engine.core.kv_cache_groups import KVCacheGroups
from officellm.engine.distributed.parallel_state import ParallelState
from officellm.engine.loading.gguf_tensors import QuantizedTensor
from officellm.engine.loading.model_spec import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    SUPPORTED_ARCHITECTURES,
    ModelSpec,
)
from officellm.engine.models import packed_linear
from officellm.engine.models.fixed_order_linear import FixedOrderWeight
from officellm.engine.models.moe import ExpertBlocks, MixtureOfExperts
from officellm.engine.models.parallel_linear import ColumnParallelLinear, RowParallelLinear
from officellm.engine.models.quantized_linear import QuantizedWeight, QuantMatmul, QuantPack
from officellm.engine.models.rotary import RotaryTable
from officellm.engine.models.shard_plan import ShardPlan
from officellm.engine.models.vision import VisionTower
from officellm.engine.models.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from officellm.engine.models.weight_names import decoder_name, is_skipped
from officellm.kernels.reference import quant_reference
from officellm.kernels.reference.moe import ExpertWeights
from officellm.kernels.reference.mxfp4 import mxfp4_rows_from_checkpoint

logger = logging.getLogger("engine")

# A layer's rotary table: the sliding layers' own where it differs (Gemma 3), else the model's.
GLOBAL_ROPE, LOCAL_ROPE = "global", "local"


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, index: int, dtype: torch.dtype, plan: ShardPlan,
                 parallel: ParallelState, matmul_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.num_heads = plan.num_q_heads
        self.num_kv_heads = plan.num_kv_heads
        self.q_size = self.num_heads * d
        self.kv_size = self.num_kv_heads * d
        self.window = spec.layer_window(index)
        self.rope = LOCAL_ROPE if spec.local_rope is not None and self.window else GLOBAL_ROPE
        e = dict(dtype=dtype)
        md = matmul_dtype or dtype

        def norm(size: int) -> nn.Parameter:
            return nn.Parameter(torch.ones(size, **e), requires_grad=False)

        self.input_norm = norm(h)
        self.post_attn_norm = norm(h)
        # Gemma 3's sandwich: post_attn_norm normalizes the attention's output, and these two
        # the MLP's input and output.
        self.pre_ff_norm = norm(h) if spec.sandwich_norms else None
        self.post_ff_norm = norm(h) if spec.sandwich_norms else None
        self.qkv = ColumnParallelLinear(h, self.q_size + 2 * self.kv_size, spec.qkv_bias, md)
        self.o_proj = RowParallelLinear(self.q_size, h, spec.o_bias, md, parallel)
        if spec.qk_norm:
            self.q_norm = norm(d)
            self.k_norm = norm(d)
        else:
            self.q_norm = self.k_norm = None
        self.sinks = (nn.Parameter(torch.zeros(self.num_heads, dtype=torch.float32),
                                   requires_grad=False) if spec.attention_sinks else None)
        self.moe: MixtureOfExperts | None = None
        self.gate_up: ColumnParallelLinear | None = None
        self.down: RowParallelLinear | None = None
        if spec.is_moe_layer(index):
            assert spec.moe is not None
            self.moe = MixtureOfExperts(spec.moe, h, dtype, plan, parallel)
        else:
            inter = len(plan.intermediate)
            self.gate_up = ColumnParallelLinear(h, 2 * inter, spec.mlp_bias, md)
            self.down = RowParallelLinear(inter, h, spec.mlp_bias, md, parallel)

    def dense_matmuls(self) -> list[ColumnParallelLinear | RowParallelLinear]:
        mlp = [self.gate_up, self.down] if self.moe is None else []
        return [m for m in (self.qkv, self.o_proj, *mlp) if m is not None]


@dataclass(frozen=True)
class ImageEmbeds:
    """A step's image rows: the flat token rows of image placeholders ([N] int64) and what
    the vision tower made for them ([N, hidden])."""

    rows: torch.Tensor
    embeds: torch.Tensor


@dataclass(frozen=True)
class KeptInBlocks:
    """What DecoderModel.keep_quantized did: how many modules read blocks, and the Hugging
    Face names of the weights released (served by blocks for every batch)."""

    modules: int
    released: frozenset[str]


def runs_dense(module: ColumnParallelLinear | RowParallelLinear | ParallelLMHead
               | VocabParallelEmbedding) -> bool:
    """Whether some batch reads a module's dense weight (so it is loaded, and worth
    packing)."""
    return module.quantized is None or module.quantized.max_rows is not None


class DecoderModel(nn.Module):
    """The whole model: embeddings, layers, final norm, LM head."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, ops: Any,
                 parallel: ParallelState | None = None,
                 matmul_dtype: torch.dtype | None = None) -> None:
        """`dtype`: the activations' (and norms'); `matmul_dtype`: the dense matmul weights'
        and the embedding table's, where they differ (a GGUF on the CPU: activations in
        float32 between matmuls that read blocks, large batches on bf16 dense weights; the
        matmuls cast their input, packed_linear.linear)."""
        super().__init__()
        parallel = parallel or ParallelState()
        self.spec = spec
        self.ops = ops
        self.parallel = parallel
        self.plan = ShardPlan.for_rank(spec, parallel.rank, parallel.world_size)
        h = spec.hidden_size
        md = matmul_dtype or dtype
        self.embed = VocabParallelEmbedding(self.plan, h, md, parallel, out_dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(spec, i, dtype, self.plan, parallel, md)
                                    for i in range(spec.num_layers))
        self.norm = nn.Parameter(torch.ones(h, dtype=dtype), requires_grad=False)
        self.lm_head = ParallelLMHead(self.plan, h, spec.vocab_size, md, parallel,
                                      tied=self.embed if spec.tie_word_embeddings else None)
        # Gemma scales the embeddings by sqrt(hidden) rounded to the model's dtype first;
        # Granite multiplies by its config's float.
        self.embed_scale: torch.Tensor | float | None = None
        if spec.embedding_multiplier is not None:
            self.embed_scale = (torch.tensor(spec.embedding_multiplier).to(dtype)
                                if SUPPORTED_ARCHITECTURES[spec.model_type].embed_scale
                                else spec.embedding_multiplier)
        self.mlp_act = (ops.gelu_tanh_and_mul if spec.activation == "gelu_tanh"
                        else ops.silu_and_mul)
        self.requires_grad_(False)
        self.rotary: dict[str, RotaryTable] = {}
        self.rotary_positions = 0

    def init_rotary(self, max_positions: int) -> None:
        device = self.embed.weight.device
        spec = self.spec
        self.rotary = {}
        for i, layer in enumerate(self.layers):
            if layer.rope not in self.rotary:
                layer_type = ((SLIDING_ATTENTION if layer.window else FULL_ATTENTION)
                              if spec.rope_per_layer_type else None)
                self.rotary[layer.rope] = RotaryTable(spec, spec.layer_rope(i), max_positions,
                                                      device, layer_type)
        self.rotary_positions = max_positions

    def attention_layers(self, groups: KVCacheGroups) -> list[LayerAttention]:
        """Each layer's KV cache group, window and sinks, for the attention backend."""
        return [LayerAttention(groups.place(i)[0], layer.window, layer.sinks)
                for i, layer in enumerate(self.layers)]

    def weight_bytes(self) -> int:
        """Bytes of every weight this rank holds, dense or in blocks."""
        dense = sum(p.numel() * p.element_size() for p in self.parameters())
        modules = [self.embed, self.lm_head,
                   *(m for layer in self.layers for m in layer.dense_matmuls())]
        # A tied head reads the embedding's blocks: count each tensor once.
        blocks = {g.data.data_ptr(): g.data.numel() for m in modules if m.quantized is not None
                  for g in m.quantized.groups}
        # Experts in blocks: their rows (their biases are parameters, counted above).
        experts = sum(t.numel() for layer in self.layers
                      if layer.moe is not None and layer.moe.quantized is not None
                      for t in (layer.moe.quantized.w13, layer.moe.quantized.w2))
        return dense + sum(blocks.values()) + experts

    def pack_linears(self, prepare: Callable[[torch.Tensor], torch.Tensor | FixedOrderWeight]
                     = packed_linear.pack) -> int:
        """Prepare every dense matmul weight for its kernel: oneDNN's packing (bf16 on the CPU;
        see packed_linear.py) by default, or `prepare`'s (the batch-invariant kernel's
        FixedOrderWeight).

        Call after load_weights. The plain weights of the layers are released (nothing reads
        them any more); the embedding keeps its own for the lookup. Returns how many prepared.
        """
        modules = [m for layer in self.layers for m in layer.dense_matmuls() if runs_dense(m)]
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
        """Each layer's dense matmuls in order, with the Hugging Face names of the weights
        fused into each."""
        fused_checkpoint = self.spec.layout == "phi3"
        for i, layer in enumerate(self.layers):
            parts = {
                layer.qkv: (("self_attn.qkv_proj",) if fused_checkpoint else
                            ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                layer.o_proj: ("self_attn.o_proj",),
            }
            if layer.gate_up is not None and layer.down is not None:
                parts[layer.gate_up] = (("mlp.gate_up_proj",) if fused_checkpoint else
                                        ("mlp.gate_proj", "mlp.up_proj"))
                parts[layer.down] = ("mlp.down_proj",)
            for module, names in parts.items():
                yield module, tuple(f"model.layers.{i}.{n}.weight" for n in names)

    def keep_quantized(self, tensors: dict[str, QuantizedTensor], matmul: QuantMatmul,
                       max_rows: int | None = None, pack: QuantPack | None = None
                       ) -> KeptInBlocks:
        """Run the matmuls whose weights `tensors` hold (Hugging Face names) over their
        blocks; one rank only. A fused weight is kept in blocks only when all its parts are.
        `max_rows`: blocks only for batches of up to that many rows, the dense weights kept
        for larger ones (the embedding lookup then reads the dense table); None: blocks for
        every batch, and those dense weights released. `pack`: the matmuls' layout (a tied
        table is packed once and read by both the head and the lookup).

        Call before load_weights, and give it the checkpoint without the weights this
        returns as released (nothing reads them: not dequantizing them is most of a GGUF's
        load time), or after it."""
        assert self.parallel.world_size == 1, "blocks are not split across ranks"
        kept, released = 0, set()

        def put(module: Any, names: Sequence[str], parts: list[QuantizedTensor],
                rows: int | None, layout: QuantPack | None) -> None:
            nonlocal kept
            module.quantized = QuantizedWeight.fuse(parts, matmul, rows, layout)
            if rows is None and module.weight is not None:
                module.weight.data = torch.empty(0, dtype=module.weight.dtype)
                released.update(names)
            kept += 1

        for module, names in self.layer_matmuls():
            found = [tensors.get(n) for n in names]
            if all(t is not None for t in found):
                put(module, names, found, max_rows, pack)  # type: ignore[arg-type]
        table_name = "model.embed_tokens.weight"
        table = tensors.get(table_name)
        if table is not None and pack is not None and self.lm_head.tied is not None:
            # The tied head and the lookup share one copy, in the matmul's layout.
            table = QuantizedTensor(table.fmt, pack(table.data, table.fmt), table.in_features)
            pack = None
        head = tensors.get("lm_head.weight") if self.lm_head.tied is None else table
        if head is not None:
            put(self.lm_head, ["lm_head.weight"], [head], max_rows, pack)
        if table is not None and max_rows is None:
            put(self.embed, [table_name], [table], None, None)
        return KeptInBlocks(kept, frozenset(released))

    def hold_experts(self, experts: dict[int, ExpertWeights], holding: ExpertBlocks) -> int:
        """Give the MoE layers in `experts` (layer -> GGUF block rows) their experts before
        the checkpoint is loaded (which then brings only their biases): kept in their
        blocks or dequantized, as `holding` says for their format. Returns how many layers
        keep blocks."""
        kept = 0
        for i, blocks in sorted(experts.items()):
            moe = self.layers[i].moe
            if moe is None:
                raise ValueError(f"Experts in blocks for layer {i}, which has no mixture of "
                                 "experts in this model.")
            keep = holding.keeps(blocks.fmt13) and holding.keeps(blocks.fmt2)
            moe.hold(blocks, keep, holding.pack)
            kept += keep
        return kept

    # -- loading -------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]],
                     expert_blocks: ExpertBlocks | None = None,
                     vision: VisionTower | None = None) -> None:
        """Load a checkpoint's tensors (any family's naming: engine/models/weight_names.py),
        fusing q/k/v and gate/up as they arrive and stacking experts; under tensor
        parallelism each tensor is cut to this rank's slice first. Experts a checkpoint
        ships in blocks (gpt-oss's MXFP4) go to `expert_blocks`' holding (kept in their
        blocks, or dequantized; by default dequantized). A multimodal checkpoint's vision
        tensors go to `vision` (the engine serves its images), else they are skipped."""
        loader = _WeightLoader(self, expert_blocks or ExpertBlocks())
        skipped = 0
        vision_tensors: list[tuple[str, torch.Tensor]] = []
        for name, tensor in weights:
            if is_skipped(name):
                skipped += 1
                if vision is not None:
                    vision_tensors.append((name, tensor))
                continue
            loader.load(decoder_name(name, self.spec.layout), tensor)
        loader.finish()
        if vision is not None:
            loaded = vision.load_weights(vision_tensors)
            logger.info("Loaded %d tensors of the %s checkpoint's vision tower: images are "
                        "served", loaded, self.spec.multimodal_wrapper or self.spec.model_type)
        elif skipped:
            logger.info("Skipped %d tensors of the %s checkpoint's vision tower: its language "
                        "model is served, images are not", skipped,
                        self.spec.multimodal_wrapper or self.spec.model_type)

    # -- forward -------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: Any,
        logits_indices: torch.Tensor,
        image_embeds: ImageEmbeds | None = None,
    ) -> torch.Tensor | None:
        """Run flat tokens [T] through the model; return logits (float32) at logits_indices
        (on rank 0; None on the other tensor-parallel ranks). `image_embeds`: the vision
        tower's rows that replace the embeddings of the image placeholder tokens."""
        logits = self.lm_head(self.hidden_states(input_ids, positions, attention, logits_indices,
                                                 image_embeds))
        if logits is None:
            return None
        spec = self.spec
        if spec.logits_divisor != 1.0:
            logits = logits / spec.logits_divisor
        if spec.final_logit_softcapping is not None:
            cap = spec.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits

    @property
    def rotary_long_offset(self) -> int:
        """What the runner adds to the positions of a sequence past LongRoPE's original
        window (its long rows); 0 for other models."""
        return max((t.long_offset for t in self.rotary.values()), default=0)

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Any,
                      indices: torch.Tensor, image_embeds: ImageEmbeds | None = None
                      ) -> torch.Tensor:
        """The final norm's output at `indices` of the flat tokens [T]: what the LM head
        reads, and what a decoder embedding model pools."""
        ops, spec = self.ops, self.spec
        d, eps = spec.head_dim, spec.rms_norm_eps
        hq, hk = self.plan.num_q_heads, self.plan.num_kv_heads
        assert self.rotary, "init_rotary() first"
        rotations = {key: table.lookup(positions) for key, table in self.rotary.items()}
        branch = spec.residual_multiplier
        x = self.embed(input_ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        if image_embeds is not None:
            # vLLM's way: the text tokens embedded, the encoder's rows scattered over the
            # image placeholders' (unscaled: transformers scales only the token embeddings).
            x = x.index_copy(0, image_embeds.rows, image_embeds.embeds.to(x.dtype))
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
            o = attention.forward(i, q, k, v, *rotations[layer.rope])
            x = layer.o_proj(o.reshape(-1, hq * d))
            if layer.pre_ff_norm is not None:
                x = ops.rms_norm(x, layer.post_attn_norm, eps)
            if branch != 1.0:
                x = x * branch
            h, residual = ops.fused_add_rms_norm(
                x, residual, layer.pre_ff_norm if layer.pre_ff_norm is not None
                else layer.post_attn_norm, eps)
            if layer.moe is not None:
                x = layer.moe(h, ops.moe_experts)
            else:
                assert layer.gate_up is not None and layer.down is not None
                x = layer.down(self.mlp_act(layer.gate_up(h)))
            if layer.post_ff_norm is not None:
                x = ops.rms_norm(x, layer.post_ff_norm, eps)
            if branch != 1.0:
                x = x * branch
        h, _ = ops.fused_add_rms_norm(x, residual, self.norm, eps)
        return h.index_select(0, indices)


class _WeightLoader:
    """Puts one checkpoint's tensors (in the decoder's naming) into a DecoderModel, and
    says what is missing at the end."""

    # Dense weights fused at load: checkpoint module -> (our module, part).
    FUSED = {"self_attn.q_proj": ("qkv", "q"), "self_attn.k_proj": ("qkv", "k"),
             "self_attn.v_proj": ("qkv", "v"), "mlp.gate_proj": ("gate_up", "g"),
             "mlp.up_proj": ("gate_up", "u")}
    ORDER = {"qkv": ("q", "k", "v"), "gate_up": ("g", "u")}
    NORMS = {"input_layernorm": "input_norm", "post_attention_layernorm": "post_attn_norm",
             "pre_feedforward_layernorm": "pre_ff_norm",
             "post_feedforward_layernorm": "post_ff_norm",
             "self_attn.q_norm": "q_norm", "self_attn.k_norm": "k_norm"}

    def __init__(self, model: DecoderModel, expert_blocks: ExpertBlocks) -> None:
        self.model = model
        self.expert_blocks = expert_blocks
        # gpt-oss's MXFP4 experts: a layer's `*_blocks` and `*_scales` until both arrive.
        self.mxfp4: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        self.spec = model.spec
        self.plan = model.plan
        self.pending: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        self.seen: set[str] = set()
        # Per MoE layer param: the (expert, part) pieces loaded so far.
        self.expert_parts: dict[str, set[tuple[int, str]]] = {}

    # -- dispatch ------------------------------------------------------------------------
    def load(self, name: str, tensor: torch.Tensor) -> None:
        model = self.model
        if name.startswith("layers."):
            _, idx, rest = name.split(".", 2)
            self._layer(int(idx), rest, tensor)
        elif name == "embed_tokens.weight":
            self._copy(model.embed, "weight", self.plan.shard(name, tensor), name)
        elif name == "norm.weight":
            self._copy(model, "norm", self._norm_weight(tensor), name)
        elif name == "lm_head.weight":
            if model.lm_head.weight is not None:
                self._copy(model.lm_head, "weight", self.plan.shard(name, tensor), name)
        else:
            raise ValueError(f"Unexpected weight {name!r} in checkpoint.")

    def _layer(self, i: int, rest: str, tensor: torch.Tensor) -> None:
        layer = self.model.layers[i]
        key = f"layers.{i}.{rest}"
        module_name, kind = rest.rsplit(".", 1)
        if module_name in self.NORMS and kind == "weight":
            target = self.NORMS[module_name]
            if getattr(layer, target) is None:
                raise ValueError(f"Unexpected weight {key!r} in checkpoint.")
            self._copy(layer, target, self._norm_weight(tensor), key)
        elif module_name in self.FUSED and (module_name.startswith("self_attn")
                                            or layer.moe is None):
            self._fuse_part(i, module_name, kind, self.plan.shard(rest, tensor))
        elif module_name == "self_attn.qkv_proj":  # Phi-3: q, k, v rows in one tensor
            spec = self.spec
            q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
            for part, piece in zip(("q_proj", "k_proj", "v_proj"), tensor.split([q, kv, kv])):
                self._layer(i, f"self_attn.{part}.{kind}", piece)
        elif module_name == "mlp.gate_up_proj" and layer.moe is None:  # Phi-3: gate, up halves
            gate, up = tensor.chunk(2, dim=0)
            self._layer(i, f"mlp.gate_proj.{kind}", gate)
            self._layer(i, f"mlp.up_proj.{kind}", up)
        elif module_name == "self_attn.o_proj":
            self._copy(layer.o_proj, kind, self.plan.shard(rest, tensor), key)
        elif module_name == "mlp.down_proj" and layer.down is not None:
            self._copy(layer.down, kind, self.plan.shard(rest, tensor), key)
        elif rest == "self_attn.sinks" and layer.sinks is not None:
            self._copy(layer, "sinks", self.plan.shard(rest, tensor), key)
        elif layer.moe is not None and rest.startswith("mlp."):
            self._expert(i, layer.moe, rest, tensor)
        elif "rotary_emb" in rest:
            return
        else:
            raise ValueError(f"Unexpected weight {key!r} in checkpoint.")

    def _norm_weight(self, tensor: torch.Tensor) -> torch.Tensor:
        # Gemma's norms multiply by 1 + w: stored as such, one multiply per norm.
        return tensor.float() + 1.0 if self.spec.norm_offset else tensor

    # -- dense -----------------------------------------------------------------------------
    def _fuse_part(self, i: int, module_name: str, kind: str, tensor: torch.Tensor) -> None:
        target, part = self.FUSED[module_name]
        key = (i, f"{target}.{kind}")
        self.pending.setdefault(key, {})[part] = tensor
        if len(self.pending[key]) == len(self.ORDER[target]):
            parts = self.pending.pop(key)
            cat = torch.cat([parts[p] for p in self.ORDER[target]], dim=0)
            self._copy(getattr(self.model.layers[i], target), kind, cat,
                       f"layers.{i}.{target}.{kind}")

    # -- experts ---------------------------------------------------------------------------
    def _expert(self, i: int, moe: MixtureOfExperts, rest: str, tensor: torch.Tensor) -> None:
        """A router or expert tensor: per expert (`mlp.experts.E.gate_proj.weight`), or the
        experts stacked (Qwen3-MoE's fused `mlp.experts.gate_up_proj` [E, 2I, H], gpt-oss's
        `mlp.experts.gate_up_proj` [E, H, 2I] with gate and up interleaved, and biases)."""
        key = f"layers.{i}.{rest}"
        plan = self.plan
        inter = moe.intermediate_size
        parts = rest.split(".")
        if rest in ("mlp.gate.weight", "mlp.gate.bias"):
            attr = "router" if parts[-1] == "weight" else "router_bias"
            if getattr(moe, attr) is None:
                raise ValueError(f"Unexpected weight {key!r} in checkpoint.")
            self._copy(moe, attr, tensor, key)
            return
        stacked = rest.removeprefix("mlp.experts.")
        if stacked.endswith(("_blocks", "_scales")):
            self._mxfp4_part(i, moe, stacked)
            self.mxfp4.setdefault((i, stacked.rsplit("_", 1)[0]), {})[
                stacked.rsplit("_", 1)[1]] = tensor
            self._mxfp4_done(i, moe)
            return
        if not stacked.endswith("_bias"):  # a matrix: dense experts
            if moe.held:
                raise ValueError(f"Layer {i}'s experts were given in blocks; the checkpoint "
                                 f"also holds {key!r}.")
            moe.allocate_dense()
        if len(parts) == 5 and parts[1] == "experts" and parts[4] == "weight":
            e, proj = int(parts[2]), parts[3]
            if proj == "gate_proj":
                moe.w13.data[e, :inter].copy_(plan.shard_expert("gate", tensor))
            elif proj == "up_proj":
                moe.w13.data[e, inter:].copy_(plan.shard_expert("up", tensor))
            elif proj == "down_proj":
                moe.w2.data[e].copy_(plan.shard_expert("down", tensor))
            else:
                raise ValueError(f"Unexpected weight {key!r} in checkpoint.")
            self._expert_piece(i, e, proj)
            return
        gpt_oss = self.spec.layout == "gpt_oss"
        if stacked == "gate_up_proj":
            # Qwen3-MoE's [E, 2I, H] (gate rows, then up); gpt-oss's [E, H, 2I] interleaved.
            w = tensor.transpose(1, 2) if gpt_oss else tensor
            gate, up = (w[:, 0::2], w[:, 1::2]) if gpt_oss else w.chunk(2, dim=1)
            for e in range(moe.spec.num_experts):
                moe.w13.data[e, :inter].copy_(plan.shard_expert("gate", gate[e]))
                moe.w13.data[e, inter:].copy_(plan.shard_expert("up", up[e]))
                self._expert_piece(i, e, "gate_proj")
                self._expert_piece(i, e, "up_proj")
        elif stacked == "down_proj":
            w = tensor.transpose(1, 2) if gpt_oss else tensor  # -> [E, H, I]
            for e in range(moe.spec.num_experts):
                moe.w2.data[e].copy_(plan.shard_expert("down", w[e]))
                self._expert_piece(i, e, "down_proj")
        elif stacked == "gate_up_proj_bias" and moe.b13 is not None:
            for e in range(moe.spec.num_experts):
                moe.b13.data[e, :inter].copy_(plan.shard_expert("gate_bias", tensor[e, 0::2]))
                moe.b13.data[e, inter:].copy_(plan.shard_expert("up_bias", tensor[e, 1::2]))
            self.seen.add(key)
        elif stacked == "down_proj_bias" and moe.b2 is not None:
            # Added once after the ranks' sum: rank 0 holds it.
            if plan.rank == 0:
                moe.b2.data.copy_(tensor)
            self.seen.add(key)
        else:
            raise ValueError(f"Unexpected weight {key!r} in checkpoint.")

    def _expert_piece(self, i: int, e: int, proj: str) -> None:
        self.expert_parts.setdefault(f"layers.{i}", set()).add((e, proj))

    def _mxfp4_part(self, i: int, moe: MixtureOfExperts, stacked: str) -> None:
        if self.spec.layout != "gpt_oss" or stacked.rsplit("_", 1)[0] not in (
                "gate_up_proj", "down_proj"):
            raise ValueError(f"Unexpected weight 'layers.{i}.mlp.experts.{stacked}' in "
                             "checkpoint.")
        if moe.held:
            raise ValueError(f"Layer {i}'s experts were given twice.")

    def _mxfp4_done(self, i: int, moe: MixtureOfExperts) -> None:
        """Once a layer's four MXFP4 tensors are in: its experts as GGUF MXFP4 rows, gate and
        up rows de-interleaved into halves, held as expert_blocks says."""
        pieces = {name: self.mxfp4.get((i, name), {}) for name in ("gate_up_proj", "down_proj")}
        if any(len(p) < 2 for p in pieces.values()):
            return
        w13 = mxfp4_rows_from_checkpoint(pieces["gate_up_proj"]["blocks"],
                                         pieces["gate_up_proj"]["scales"])
        w2 = mxfp4_rows_from_checkpoint(pieces["down_proj"]["blocks"],
                                        pieces["down_proj"]["scales"])
        w13 = torch.cat([w13[:, 0::2], w13[:, 1::2]], dim=1)  # gate rows, then up rows
        for name in pieces:
            del self.mxfp4[(i, name)]
        experts = ExpertWeights(w13, w2, quant_reference.MXFP4, quant_reference.MXFP4)
        if self.plan.world_size > 1:  # blocks are not split across ranks: dense slices
            experts = _expert_slice(experts, self.plan)
        moe.hold(experts, self.plan.world_size == 1 and
                 self.expert_blocks.keeps(quant_reference.MXFP4), self.expert_blocks.pack)

    # -- bookkeeping -------------------------------------------------------------------------
    def _copy(self, obj: Any, attr: str, tensor: torch.Tensor, name: str) -> None:
        param = getattr(obj, attr)
        if param is None or param.shape != tensor.shape:
            shape = None if param is None else tuple(param.shape)
            raise ValueError(f"Weight {name!r}: checkpoint {tuple(tensor.shape)} vs model {shape}")
        param.data.copy_(tensor.to(param.dtype))
        self.seen.add(name)

    def finish(self) -> None:
        """Raise ValueError naming what the checkpoint did not hold."""
        if self.pending:
            raise ValueError(f"Incomplete fused weights in checkpoint: {sorted(self.pending)}")
        if self.mxfp4:
            raise ValueError(f"MXFP4 experts without their blocks or scales: "
                             f"{sorted(self.mxfp4)}")
        missing = [n for n in self.expected() if n not in self.seen]
        for i, layer in enumerate(self.model.layers):
            if layer.moe is None or layer.moe.held:
                continue
            got = self.expert_parts.get(f"layers.{i}", set())
            want = {(e, p) for e in range(layer.moe.spec.num_experts)
                    for p in ("gate_proj", "up_proj", "down_proj")}
            if got != want:
                missing.append(f"layers.{i} experts ({len(want - got)} of {len(want)} "
                               "expert weights)")
        if missing:
            raise ValueError(
                f"Checkpoint lacks {len(missing)} expected weights ({', '.join(missing[:4])}"
                f"{', ...' if len(missing) > 4 else ''}); is it the right architecture?")

    def expected(self) -> list[str]:
        """Every name `seen` must hold once the checkpoint is loaded (experts apart)."""
        model, spec = self.model, self.spec
        names = ["norm.weight"]
        if runs_dense(model.embed):
            names.append("embed_tokens.weight")
        if model.lm_head.weight is not None and runs_dense(model.lm_head):
            names.append("lm_head.weight")
        for i, layer in enumerate(model.layers):
            p = f"layers.{i}."
            names += [p + "qkv.weight"] if runs_dense(layer.qkv) else []
            names += [p + "self_attn.o_proj.weight"] if runs_dense(layer.o_proj) else []
            names += [p + f"{n}.weight" for n, attr in self.NORMS.items()
                      if getattr(layer, attr) is not None]
            if spec.qkv_bias:
                names.append(p + "qkv.bias")
            if spec.o_bias:
                names.append(p + "self_attn.o_proj.bias")
            if layer.sinks is not None:
                names.append(p + "self_attn.sinks")
            if layer.moe is not None:
                names.append(p + "mlp.gate.weight")
                if layer.moe.router_bias is not None:
                    names.append(p + "mlp.gate.bias")
                if layer.moe.b13 is not None:
                    names += [p + "mlp.experts.gate_up_proj_bias",
                              p + "mlp.experts.down_proj_bias"]
            else:
                assert layer.gate_up is not None and layer.down is not None
                names += [p + "gate_up.weight"] if runs_dense(layer.gate_up) else []
                names += [p + "mlp.down_proj.weight"] if runs_dense(layer.down) else []
                if spec.mlp_bias:
                    names += [p + "gate_up.bias", p + "mlp.down_proj.bias"]
        return names


def _expert_slice(experts: ExpertWeights, plan: ShardPlan) -> ExpertWeights:
    """Blocks dequantized to this rank's slice of each expert (tensor parallelism)."""
    i = experts.intermediate_size
    gate = quant_reference.dequantize(experts.w13.flatten(0, 1), experts.fmt13).view(
        experts.num_experts, 2 * i, -1)
    down = quant_reference.dequantize(experts.w2.flatten(0, 1), experts.fmt2).view(
        experts.num_experts, experts.w2.shape[1], -1)
    r = plan.expert_intermediate
    w13 = torch.cat([gate[:, r.start:r.stop], gate[:, i + r.start:i + r.stop]], dim=1)
    return ExpertWeights(w13, down[:, :, r.start:r.stop].contiguous())
