"""Gemma 3 vision on the CPU: the engine's vision tower against transformers', and the time to
the first token of a screenshot question, on the same random weights of the real config
(engine/model_configs/gemma-3-4b-it.json), in one run on one machine.

  (a) images/s through the vision tower + projector (SigLIP at its real size: 27 layers,
      896x896 pixels in 14-pixel patches, pooled to 256 tokens an image), at batch 1 and 4:
      the engine's Gemma3VisionTower.encode vs transformers' SiglipVisionModel +
      Gemma3MultiModalProjector (what Gemma3Model.get_image_features runs).
  (b) TTFT of one screenshot (a rendered 1280x800 page of text) and a one-line question:
      the engine's LLM.generate(multimodal=..., max_tokens=1) from the processed prompt vs
      transformers' Gemma3ForConditionalGeneration forward over the same ids, pixels and
      token_type_ids to the first token's argmax. Also the engine's TTFT when the same
      screenshot is sent again (a prefix-cache hit: no tower, no prefill of the image).

Both sides run float32 (this CPU has no native bfloat16). The 4B model's 34 text layers in
float32 (17 GB a copy) do not fit a small machine, so (b) cuts the language model to
--text-layers layers (default 4; the tower, the embeddings and the vocabulary stay real):
the TTFT measured is the tower's plus that many layers' prefill, said in the JSON.
--vision-layers cuts the tower's depth the same way (its width, 896-pixel images and 256
tokens stay real) for a CPU too slow or too shared to run 27 layers many times: each layer
is alike, so the JSON adds the full depth's images/s estimated per layer.
The prompt's text is tokenized with the bundled SmolLM2 tokenizer (random weights make
the answer meaningless; its length is what counts). Both sides get --threads threads.

Writes benchmarks/results/vision.json (the machine, the settings, each row and its ratio to
transformers in the same run) and .png. --smoke: a tiny config in seconds (for the tests).

    .venv/bin/python benchmarks/vision.py [--threads 2] [--text-layers 4] [--vision-layers N]
                                 [--skip tower|ttft]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import cpu_description  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
REAL_CONFIG = REPO / "engine" / "model_configs" / "gemma-3-4b-it.json"
QUESTION = "What is the total amount on this invoice, and when is it due?"

# --smoke: the real config's shape scaled down (tokens per image, patch size and the
# vocabulary, so the real image-token ids, stay real).
SMOKE_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, image_size=56)
SMOKE_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  query_pre_attn_scalar=16, sliding_window=16)
SMOKE_TOKENS_PER_IMAGE = 4


def model_config(smoke: bool, text_layers: int | None,
                 vision_layers: int | None) -> dict[str, Any]:
    """The checkpoint's config.json as a dict: the real 4B's, or --smoke's scaled-down one;
    its language model cut to `text_layers` layers and its tower to `vision_layers` when
    given."""
    config = json.loads(REAL_CONFIG.read_text())
    if smoke:
        config["vision_config"].update(SMOKE_VISION)
        config["text_config"].update(SMOKE_TEXT)
        config["mm_tokens_per_image"] = SMOKE_TOKENS_PER_IMAGE
    if text_layers is not None:
        config["text_config"]["num_hidden_layers"] = text_layers
    if vision_layers is not None:
        config["vision_config"]["num_hidden_layers"] = vision_layers
    return config


def hf_config(config: dict[str, Any]) -> Any:
    from transformers import Gemma3Config

    return Gemma3Config(**{k: v for k, v in config.items() if k != "model_type"})


def image_processor_config(config: dict[str, Any]) -> dict[str, Any]:
    """google/gemma-3-4b-it's preprocessor_config.json, sized for the config's tower."""
    size = config["vision_config"]["image_size"]
    return {"do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None,
            "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
            "image_seq_length": config["mm_tokens_per_image"], "resample": 2,
            "rescale_factor": 1 / 255, "size": {"height": size, "width": size},
            "processor_class": "Gemma3Processor"}


def screenshot(seed: int) -> Any:
    """A 1280x800 page of text lines, like a screenshot of a document (a different one per
    seed, so no cache can serve one for another)."""
    import random

    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    img = Image.new("RGB", (1280, 800), "white")
    draw = ImageDraw.Draw(img)
    words = ("invoice total amount due date net tax order item quantity price customer "
             "account reference payment terms days").split()
    for line in range(36):
        draw.text((24, 12 + 21 * line), " ".join(rng.choice(words) for _ in range(14)),
                  fill=(rng.randrange(80), rng.randrange(80), rng.randrange(80)))
    return img


def pixels(config: dict[str, Any], batch: int) -> torch.Tensor:
    """`batch` processed screenshots: [batch, 3, size, size], as the image processor makes
    them (the Gemma 3 processor of the config's size)."""
    from transformers import Gemma3ImageProcessor

    proc = Gemma3ImageProcessor(**{k: v for k, v in image_processor_config(config).items()
                                   if k not in ("image_processor_type", "processor_class")})
    return proc(images=[screenshot(i) for i in range(batch)],
                return_tensors="pt")["pixel_values"]


@torch.inference_mode()
def tower_rows(config: dict[str, Any], batches: list[int], repeats: int) -> list[dict]:
    """(a): images/s of both towers on the same weights, per batch size."""
    from transformers import AutoModel
    from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector

    from officellm.engine.models.vision.gemma3 import Gemma3VisionTower
    from officellm.engine.multimodal.inputs import ImageFeature

    cfg = hf_config(config)
    cfg.vision_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hf_tower = AutoModel.from_config(cfg.vision_config, dtype=torch.float32).eval()
    hf_projector = Gemma3MultiModalProjector(cfg).eval()
    with torch.no_grad():  # the projector's own init is zeros: give it values
        hf_projector.mm_input_projection_weight.normal_(0, 0.02)
        hf_projector.mm_soft_emb_norm.weight.normal_(0, 0.1)
    ours = Gemma3VisionTower(config, torch.float32, torch.device("cpu"))
    ours.load_weights([*((f"model.vision_tower.{k}", v)
                         for k, v in hf_tower.state_dict().items()),
                       *((f"model.multi_modal_projector.{k}", v)
                         for k, v in hf_projector.state_dict().items())])
    tokens = config["mm_tokens_per_image"]

    def features(px: torch.Tensor) -> list[ImageFeature]:
        return [ImageFeature(0, tokens, f"image-{i}", px[i:i + 1], None)
                for i in range(px.shape[0])]

    def hf_run(px: torch.Tensor) -> torch.Tensor:
        return hf_projector(hf_tower(pixel_values=px).last_hidden_state)

    def ours_run(px: torch.Tensor) -> torch.Tensor:
        return torch.stack(ours.encode(features(px)))

    # One untimed batch-1 call each (the first call's allocations and kernel choices): at
    # the real size a call is a minute on a small CPU, so only this once.
    warm = pixels(config, 1)
    hf_run(warm), ours_run(warm)
    rows = []
    for batch in batches:
        px = pixels(config, batch)
        outputs = {}
        for name, fn in (("transformers", hf_run), ("engine", ours_run)):
            seconds = float("inf")
            for _ in range(repeats):  # the fastest kept
                t0 = time.perf_counter()
                outputs[name] = fn(px)
                seconds = min(seconds, time.perf_counter() - t0)
            rows.append({"run": f"{name}, batch {batch}", "side": name, "batch": batch,
                         "seconds_per_batch": seconds, "images_per_s": batch / seconds})
            print(f"tower {name:<12} batch {batch}: {batch / seconds:7.3f} images/s "
                  f"({seconds:.2f} s a batch)", flush=True)
        diff = (outputs["engine"] - outputs["transformers"]).abs().max().item()
        for row in rows[-2:]:
            row["max_abs_diff_vs_transformers"] = diff
    peer = {r["batch"]: r["images_per_s"] for r in rows if r["side"] == "transformers"}
    for row in rows:
        row["vs_transformers_same_batch"] = row["images_per_s"] / peer[row["batch"]]
    return rows


def write_checkpoint(config: dict[str, Any], out: Path) -> Any:
    """A random-weight Gemma3ForConditionalGeneration of `config` saved as a checkpoint the
    engine loads (with the bundled tokenizer and Gemma 3's image processor config); the
    transformers model itself is returned for the reference."""
    from transformers import AutoTokenizer, Gemma3ForConditionalGeneration

    from officellm.engine.loading.model_loader import resolve_model_dir

    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(hf_config(config)).eval()
    with torch.no_grad():  # the projector's own init is zeros: give it values
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.02)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(resolve_model_dir(None))).save_pretrained(str(out))
    (out / "preprocessor_config.json").write_text(
        json.dumps(image_processor_config(config), indent=1))
    return model


def ttft_rows(config: dict[str, Any], args: argparse.Namespace) -> list[dict]:
    """(b): TTFT of a screenshot question, transformers' forward vs the engine's LLM."""
    from officellm.engine import LLM, SamplingParams, load_multimodal_processor
    from officellm.engine.loading.tokenizer import load_tokenizer

    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "gemma-3-4b-random"
        t0 = time.perf_counter()
        held = {"hf": write_checkpoint(config, model_dir)}
        print(f"checkpoint written in {time.perf_counter() - t0:.0f} s", flush=True)
        processor = load_multimodal_processor(model_dir)
        assert processor is not None
        tok = load_tokenizer(model_dir)
        # Gemma 3's chat template's turn around one image marker and the question.
        before = tok.encode("<start_of_turn>user\n", add_special_tokens=False)
        after = tok.encode(f"{QUESTION}<end_of_turn>\n<start_of_turn>model\n",
                           add_special_tokens=False)
        marker = [config["boi_token_index"]]
        prompts = [processor.process(before + marker + after, [screenshot(100 + i)])
                   for i in range(args.repeats + 1)]
        prompt_tokens = len(prompts[0].token_ids)

        @torch.inference_mode()
        def hf_first_token(mm: Any) -> int:
            ids = torch.tensor([mm.token_ids])
            out = held["hf"](input_ids=ids, attention_mask=torch.ones_like(ids),
                     pixel_values=mm.images[0].pixel_values,
                     token_type_ids=(ids == config["image_token_index"]).long(),
                     logits_to_keep=1)
            return int(out.logits[0, -1].argmax())

        hf_first_token(prompts[0])  # warm-up on another screenshot
        hf_times, hf_tokens = [], []
        for mm in prompts[1:]:
            t0 = time.perf_counter()
            hf_tokens.append(hf_first_token(mm))
            hf_times.append(time.perf_counter() - t0)
        hf_s = min(hf_times)
        rows.append({"run": "transformers forward", "ttft_s": hf_s,
                     "prompt_tokens": prompt_tokens})
        print(f"ttft transformers: {hf_s:.2f} s ({prompt_tokens} prompt tokens)", flush=True)
        held.clear()
        gc.collect()  # one copy of the weights at a time

        params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        with LLM(str(model_dir), device="cpu", dtype="float32", kv_cache_memory="512MiB",
                 max_model_len=max(1024, prompt_tokens + 16),
                 max_num_batched_tokens=max(2048, prompt_tokens),
                 num_threads=args.threads) as llm:
            def engine_first_token(mm: Any) -> int:
                return llm.generate(mm, params)[0].outputs[0].token_ids[0]

            engine_first_token(prompts[0])  # warm-up on another screenshot
            times, tokens = [], []
            for mm in prompts[1:]:
                t0 = time.perf_counter()
                tokens.append(engine_first_token(mm))
                times.append(time.perf_counter() - t0)
            engine_s = min(times)
            cached_s = _time(lambda: engine_first_token(prompts[1]))  # sent again
        rows.append({"run": "engine LLM", "ttft_s": engine_s, "prompt_tokens": prompt_tokens,
                     "first_token_equals_transformers": tokens == hf_tokens})
        rows.append({"run": "engine LLM, same screenshot again (prefix-cache hit)",
                     "ttft_s": cached_s, "prompt_tokens": prompt_tokens})
        print(f"ttft engine: {engine_s:.2f} s; the same screenshot again: {cached_s:.2f} s",
              flush=True)
    for row in rows:
        row["vs_transformers"] = rows[0]["ttft_s"] / row["ttft_s"]  # >1: faster
    return rows


def _time(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tower, ttft = doc.get("tower", []), doc.get("ttft", [])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    colour = {"transformers": "#888", "engine": "#36c"}
    axes[0].bar([r["run"] for r in tower], [r["images_per_s"] for r in tower],
                color=[colour[r["side"]] for r in tower])
    axes[0].set_ylabel("images / s")
    model = doc["model"]
    axes[0].set_title(f"(a) vision tower + projector ({model['vision_layers_measured']} of "
                      f"{model['vision_layers_real']} layers)")
    axes[1].bar([r["run"].replace(" (prefix-cache hit)", "\n(cache hit)") for r in ttft],
                [r["ttft_s"] for r in ttft],
                color=["#888" if r["run"].startswith("transformers") else "#36c"
                       for r in ttft])
    axes[1].set_ylabel("seconds to the first token")
    axes[1].set_title(f"(b) screenshot question, {model['text_layers_measured']} of "
                      f"{model['text_layers_real']} text layers")
    for ax in axes:
        ax.tick_params(axis="x", rotation=12, labelsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"Gemma 3 4B config, random weights, float32, {doc['machine']['model']}, "
                 f"{doc['settings']['threads']} threads", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    p.add_argument("--repeats", type=int, default=1,
                   help="timed calls per measurement after the warm-up (the fastest kept)")
    p.add_argument("--text-layers", type=int, default=None,
                   help="(b) the language model's depth (the real 4B has 34); default 4, "
                        "--smoke's 2")
    p.add_argument("--vision-layers", type=int, default=None,
                   help="cut the tower to this many of its 27 layers (its width, image size "
                        "and tokens stay real); the JSON then also gives the full depth's "
                        "images/s estimated per layer. Default: all 27")
    p.add_argument("--skip", nargs="*", default=[], choices=["tower", "ttft"])
    p.add_argument("--smoke", action="store_true", help="a tiny config: seconds")
    p.add_argument("--out", type=Path, default=RESULTS / "vision.json")
    args = p.parse_args()
    if args.text_layers is None:
        args.text_layers = SMOKE_TEXT["num_hidden_layers"] if args.smoke else 4
    torch.set_num_threads(args.threads)
    t0 = time.monotonic()
    config = model_config(args.smoke, None, args.vision_layers)
    real_vision_layers = model_config(args.smoke, None, None)["vision_config"][
        "num_hidden_layers"]
    doc: dict[str, Any] = {
        "machine": cpu_description(), "settings": vars(args) | {"out": str(args.out)},
        "model": {"config": "tiny (--smoke)" if args.smoke else str(REAL_CONFIG.name),
                  "weights": "random", "dtype": "float32",
                  "image_size": config["vision_config"]["image_size"],
                  "tokens_per_image": config["mm_tokens_per_image"],
                  "vision_layers_real": real_vision_layers,
                  "vision_layers_measured": config["vision_config"]["num_hidden_layers"],
                  "text_layers_real": config["text_config"]["num_hidden_layers"],
                  "text_layers_measured": args.text_layers},
        "torch": torch.__version__}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if "tower" not in args.skip:
        doc["tower"] = tower_rows(config, args.batches, args.repeats)
        scale = config["vision_config"]["num_hidden_layers"] / real_vision_layers
        if scale != 1:  # the layers are all alike: time scales with their number
            for row in doc["tower"]:
                row["images_per_s_full_depth_estimate"] = row["images_per_s"] * scale
        args.out.write_text(json.dumps(doc, indent=1))  # kept should (b) not finish
    if "ttft" not in args.skip:
        doc["ttft"] = ttft_rows(model_config(args.smoke, args.text_layers, args.vision_layers),
                                args)
    doc["wall_s"] = time.monotonic() - t0
    args.out.write_text(json.dumps(doc, indent=1))
    plot(doc, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
