"""Gemma 3's vision tower: SigLIP, then its multimodal projector.

The SigLIP encoder is transformers' own module (AutoModel over the checkpoint's
vision_config, as Gemma3Model builds it), not a copy in engine/models/: it runs once per
image, a small share of a screenshot question's time next to the language model's prefill
over the image's 256 tokens, so the engine's paged kernels have nothing to win there, and
transformers' module is by construction the reference's numerics (SDPA attention, the same
layer norms and GELU). The projector is here, five lines: average-pool the tower's patch grid
down to mm_tokens_per_image tokens, Gemma's RMSNorm (times 1 + w, in float32), then one
matmul into the language model's width (transformers' Gemma3MultiModalProjector).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from officellm.engine.multimodal.inputs import ImageFeature

# The checkpoint's prefixes of the tower and the projector: transformers 5's and 4's.
_TOWER = ("model.vision_tower.", "vision_tower.")
_PROJECTOR = ("model.multi_modal_projector.", "multi_modal_projector.")


class Gemma3VisionTower(nn.Module):
    """SigLIP plus Gemma 3's projector (engine.models.vision.VisionTower)."""

    bidirectional_images = True  # transformers' token_type_ids mask (Gemma3Model)

    def __init__(self, config: dict[str, Any], dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModel

        vision = dict(config["vision_config"])
        vision_type = vision.pop("model_type", "siglip_vision_model")
        vision_config = AutoConfig.for_model(vision_type, **vision)
        # SDPA, as transformers picks for the reference model on these devices.
        vision_config._attn_implementation = "sdpa"
        self.tower = AutoModel.from_config(vision_config, dtype=dtype)
        hidden = vision_config.hidden_size
        text_hidden = config["text_config"]["hidden_size"]
        self.eps = float(vision_config.layer_norm_eps)
        self.norm = nn.Parameter(torch.zeros(hidden, dtype=dtype), requires_grad=False)
        self.projection = nn.Parameter(torch.zeros(hidden, text_hidden, dtype=dtype),
                                       requires_grad=False)
        self.patches_per_side = vision_config.image_size // vision_config.patch_size
        self.max_tokens_per_image = int(config.get("mm_tokens_per_image", 256))
        tokens_per_side = int(self.max_tokens_per_image ** 0.5)
        self.kernel = self.patches_per_side // tokens_per_side
        self.dtype = dtype
        self.requires_grad_(False)
        self.eval()
        self.to(device)

    @torch.inference_mode()
    def encode(self, images: Sequence[ImageFeature]) -> list[torch.Tensor]:
        """Every image through the tower in one batch (Gemma 3's images are all one size)."""
        device = self.projection.device
        pixels = torch.cat([image.pixel_values for image in images]).to(device, self.dtype)
        hidden = self.tower(pixel_values=pixels).last_hidden_state  # [B, patches, H]
        b, _, h = hidden.shape
        grid = hidden.transpose(1, 2).reshape(b, h, self.patches_per_side, self.patches_per_side)
        pooled = nn.functional.avg_pool2d(grid.contiguous(), self.kernel, self.kernel)
        tokens = pooled.flatten(2).transpose(1, 2)  # [B, tokens, H]
        normed = _gemma_rms_norm(tokens, self.norm, self.eps)
        out = torch.matmul(normed, self.projection).to(hidden.dtype)
        return list(out.unbind(0))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        tower = self.tower.state_dict()
        seen: set[str] = set()
        for name, tensor in weights:
            if name.startswith(_PROJECTOR):
                rest = name.split("multi_modal_projector.", 1)[1]
                target = {"mm_input_projection_weight": self.projection,
                          "mm_soft_emb_norm.weight": self.norm}.get(rest)
                if target is None:
                    raise ValueError(f"Unexpected weight {name!r} in checkpoint.")
                target.copy_(tensor)
                seen.add(rest)
                continue
            rest = next((name[len(p):] for p in _TOWER if name.startswith(p)), None)
            if rest is None:
                raise ValueError(f"Unexpected weight {name!r} in checkpoint.")
            rest = rest.removeprefix("vision_model.")  # transformers 4's nesting
            if rest not in tower:
                raise ValueError(f"Unexpected weight {name!r} in checkpoint.")
            tower[rest].copy_(tensor)
            seen.add(rest)
        missing = [n for n in (*tower, "mm_input_projection_weight", "mm_soft_emb_norm.weight")
                   if n not in seen]
        if missing:
            raise ValueError(f"The checkpoint lacks vision weights: {', '.join(missing[:5])}")
        return len(seen)


def _gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: in float32, times (1 + w), cast back (Gemma3RMSNorm)."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).type_as(x)
