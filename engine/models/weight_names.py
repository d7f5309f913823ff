"""Checkpoint tensor names, as each family's files spell them, in the decoder's one naming.

The decoder loads Llama-style names (`layers.N.self_attn.q_proj.weight`,
`layers.N.mlp.gate_proj.weight`, `layers.N.mlp.experts.E.up_proj.weight`...). Families that
spell theirs otherwise are renamed here, once: Mixtral's `block_sparse_moe` with w1/w3/w2,
gpt-oss's router, a multimodal checkpoint's language model under its wrapper (its vision
tower skipped). Fused tensors that need splitting (Phi-3's qkv_proj and gate_up_proj,
gpt-oss's stacked experts) keep their names: the decoder's loader splits them.
"""

from __future__ import annotations

# Prefixes of a multimodal checkpoint's language model, old (transformers 4) and new (5).
_TEXT_PREFIXES = ("language_model.model.", "model.language_model.")
_TEXT_HEADS = ("language_model.lm_head.",)
# What a text-only engine skips of a multimodal checkpoint.
_SKIPPED = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
            "model.multi_modal_projector.", "vision_model.", "model.vision_model.",
            "visual.", "model.visual.")  # the last two: Qwen2.5-VL's tower

_MIXTRAL = {"block_sparse_moe.gate.": "mlp.gate.", "block_sparse_moe.experts.": "mlp.experts."}
_MIXTRAL_EXPERT = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def is_skipped(name: str) -> bool:
    """A tensor the text decoder never reads (a vision tower's, a projector's)."""
    return name.startswith(_SKIPPED)


def decoder_name(name: str, layout: str) -> str:
    """`name` in the decoder's naming, without the leading `model.` (e.g.
    `layers.3.mlp.experts.7.gate_proj.weight`, `embed_tokens.weight`, `lm_head.weight`)."""
    for prefix in _TEXT_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    else:
        for head in _TEXT_HEADS:
            if name.startswith(head):
                name = "lm_head." + name[len(head):]
        name = name.removeprefix("model.")
    if not name.startswith("layers."):
        return name
    _, idx, rest = name.split(".", 2)
    if layout == "mixtral":
        for old, new in _MIXTRAL.items():
            if rest.startswith(old):
                rest = new + rest[len(old):]
                parts = rest.split(".")
                if parts[1] == "experts" and parts[3] in _MIXTRAL_EXPERT:
                    parts[3] = _MIXTRAL_EXPERT[parts[3]]
                    rest = ".".join(parts)
                break
    elif layout == "gpt_oss" and rest.startswith("mlp.router."):
        rest = "mlp.gate." + rest[len("mlp.router."):]
    return f"layers.{idx}.{rest}"
