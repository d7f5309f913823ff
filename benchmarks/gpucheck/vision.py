"""(v) Images in prompts on the device: a tiny random Gemma 3 (the 4B config scaled down:
SigLIP on 112-pixel images pooled to 16 tokens an image, a four-layer language model with
16-token sliding windows) must give transformers' greedy tokens (float32) for two prompts,
each one image, batched together, on the default attention backend and on the torch one.

Gemma 3's image tokens attend to each other both ways (AttentionMetadata.bidirectional). A
backend that refuses images is recorded with its reason; one that ignores that mask and
answers differently from transformers is the failure this section exists to catch, and it
says so in words rather than as a bare mismatch.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpucheck.models import CONFIG_DIR, free_cuda, write_model_dir
from benchmarks.gpucheck.parity import _compare

VOCAB = 512
IMAGE_SIZE, TOKENS_PER_IMAGE = 112, 16
MAX_NEW = 12


def _config() -> Any:
    """gemma-3-4b-it's config at toy size; the image token ids at the vocabulary's end."""
    from transformers import Gemma3Config

    raw = json.loads((CONFIG_DIR / "gemma-3-4b-it.json").read_text())
    raw["text_config"].update(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=16,
        vocab_size=VOCAB, layer_types=["sliding_attention", "sliding_attention",
                                       "full_attention", "sliding_attention"],
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    raw["text_config"].pop("sliding_window_pattern", None)
    raw["vision_config"].update(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                num_attention_heads=2, image_size=IMAGE_SIZE)
    raw.update(mm_tokens_per_image=TOKENS_PER_IMAGE, image_token_index=VOCAB - 1,
               boi_token_index=VOCAB - 3, eoi_token_index=VOCAB - 2, eos_token_id=2)
    for key in ("model_type", "architectures", "torch_dtype"):
        raw.pop(key, None)
    return Gemma3Config(**raw)


def _checkpoint(out: Path) -> Any:
    """The random checkpoint on disk (weights, word-level tokenizer, image processor config);
    transformers' model of it returned (on the CPU, float32)."""
    from transformers import Gemma3ForConditionalGeneration

    cfg = _config()
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(cfg).eval()
    # Larger weights than the default init: peaked logits, so parity is about the engine.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2 if "embed" in name else 0.08)
            elif "norm" not in name:
                p.normal_(0.0, 0.05)
    write_model_dir(cfg.text_config, out)  # the tokenizer (and a config replaced below)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
        "do_normalize": True, "do_rescale": True, "do_resize": True, "resample": 2,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "rescale_factor": 1 / 255, "image_seq_length": TOKENS_PER_IMAGE,
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}}))
    return model


def _image(seed: int) -> Any:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (90, 130, 3), generator=g,
                                         dtype=torch.uint8).numpy())


@torch.inference_mode()
def _hf_greedy(model: Any, mm: Any, image_token: int, device: torch.device) -> list[int]:
    ids = torch.tensor([mm.token_ids], device=device)
    out = model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids),
        pixel_values=mm.images[0].pixel_values.to(device),
        token_type_ids=(ids == image_token).long(), do_sample=False, max_new_tokens=MAX_NEW,
        min_new_tokens=MAX_NEW, eos_token_id=None, pad_token_id=0, temperature=None,
        top_p=None, top_k=None)
    return out[0, ids.shape[1]:].tolist()


def _engine_greedy(model_dir: Path, prompts: list[Any], device: torch.device,
                   backend: str | None) -> tuple[str, list[list[int]]]:
    """(the backend the engine ran, each prompt's greedy tokens), both prompts batched."""
    from officellm.engine.frontend.sampling_params import SamplingParams
    from officellm.engine.llm_engine import LLMEngine

    engine = LLMEngine(model=str(model_dir), device=device.type, dtype="float32",
                       attention_backend=backend, kv_cache_memory="256MiB",
                       max_model_len=512, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    for i, mm in enumerate(prompts):
        engine.add_request(f"v{i}", None, params, multimodal=mm)
    tokens: dict[str, list[int]] = {f"v{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.error:
                raise RuntimeError(f"engine request {out.request_id} failed: {out.error}")
            tokens[out.request_id].extend(out.outputs[0].token_ids)
    name = engine.engine_core.backend
    engine.close()
    return name, [tokens[f"v{i}"] for i in range(len(prompts))]


def run(device: torch.device, smoke: bool) -> dict:
    from officellm.engine import load_multimodal_processor
    from officellm.engine.attention.selection import backend_for

    t0 = time.perf_counter()
    report: dict = {"model": f"gemma-3-4b-it-shaped at toy size, random weights, float32, "
                             f"{IMAGE_SIZE}-pixel images, {TOKENS_PER_IMAGE} tokens each",
                    "prompts": 2, "new_tokens": MAX_NEW, "backends": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "gemma3-vision"
        hf = _checkpoint(model_dir).to(device)
        config = json.loads((model_dir / "config.json").read_text())
        processor = load_multimodal_processor(model_dir)
        if processor is None:
            raise RuntimeError("load_multimodal_processor found no vision in the checkpoint")
        g = torch.Generator().manual_seed(3)
        before, after = (torch.randint(3, VOCAB - 3, (n,), generator=g).tolist()
                         for n in (10, 24))
        prompts = [processor.process(before + [config["boi_token_index"]] + after,
                                     [_image(seed)]) for seed in (1, 2)]
        report["prompt_tokens"] = len(prompts[0].token_ids)
        ref = [_hf_greedy(hf, mm, config["image_token_index"], device) for mm in prompts]
        del hf
        free_cuda()
        # The image must decide the answer, or this section could pass without it.
        report["images_change_the_answer"] = ref[0] != ref[1]
        default = backend_for(device)
        report["default_backend"] = default
        for backend in dict.fromkeys((default, "torch")):
            try:
                ran, ours = _engine_greedy(model_dir, prompts, device, backend)
            except Exception as exc:  # noqa: BLE001 - a refusal is a finding, recorded
                report["backends"][backend] = {"refused": f"{type(exc).__name__}: {exc}"}
                free_cuda()
                continue
            result = {**_compare(ours, ref), "backend": ran}
            if not result["identical"]:
                result["note"] = (
                    f"the {backend} backend's tokens differ from transformers' for an image "
                    "prompt: it does not honour Gemma 3's two-way mask within an image "
                    "(AttentionMetadata.bidirectional), or its image rows are wrong")
            report["backends"][backend] = result
            free_cuda()
    runs = report["backends"]
    reference_path = runs.get("torch", {})
    # A refusal is said plainly and is not a failure; a silent wrong answer is.
    report["ok"] = bool(reference_path.get("identical")) and report["images_change_the_answer"] \
        and all(r.get("identical") or "refused" in r for r in runs.values())
    report["seconds"] = time.perf_counter() - t0
    return report
