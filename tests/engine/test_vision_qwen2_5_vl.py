"""Qwen2.5-VL in the engine: its language model with M-RoPE, its vision tower and its
processor give transformers' greedy tokens (float32) on the same tiny random weights.

The model is a Qwen2_5_VLForConditionalGeneration built once for this file from a scaled-down
Qwen2.5-VL-7B config (hidden 64, 2 layers, M-RoPE sections [2, 3, 3] of the 8 frequencies of
a 16-wide head; a vision tower of depth 2 whose second layer is its full-attention one, 14-px
patches merged 2x2 and 56-px windows), with SmolLM2's tokenizer plus Qwen's three vision
tokens and Qwen2.5-VL's image processor config, written here (no downloads).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from officellm.engine import SamplingParams
from officellm.engine.loading.model_spec import ModelSpec
from officellm.engine.models.mrope import mrope_positions
from officellm.engine.multimodal.inputs import MultiModalPrompt
from tests.engine.conftest import make_llm
from tests.support.hf_reference import HFGreedy, compare_greedy, hf_greedy

MAX_NEW = 12
PARAMS = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2)
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Qwen2.5-VL's preprocessor_config.json, as shipped (min/max pixels scaled to tiny images).
IMAGE_PROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "do_rescale": True,
    "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
    "merge_size": 2,
}


def tiny_qwen2_5_vl_config(tokenizer):
    """Qwen2.5-VL-7B's config, scaled down (the text model's rope in its M-RoPE form)."""
    from transformers import AutoConfig

    ids = dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    return AutoConfig.for_model(
        "qwen2_5_vl",
        text_config=dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                          "mrope_section": [2, 3, 3]},
                         use_sliding_window=False, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
                           tokens_per_second=2),
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], tie_word_embeddings=False)


def build_tiny_qwen2_5_vl(out_dir: Path, tokenizer_dir: Path) -> Path:
    """Save the tiny random Qwen2.5-VL with its tokenizer and image processor config."""
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(tiny_qwen2_5_vl_config(tok))
    # Larger weights than the default init: decisive greedy tokens (tiny_models.py's reason).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2 if "embed" in name or "lm_head" in name else 0.08)
            elif "norm" not in name:
                p.normal_(0.0, 0.05)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.save_pretrained(str(out_dir))
    (out_dir / "preprocessor_config.json").write_text(json.dumps(IMAGE_PROCESSOR))
    return out_dir


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory, smollm2_dir) -> Path:
    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen2_5_vl"), smollm2_dir)


@pytest.fixture(scope="module")
def hf_model(qwen_dir):
    from transformers import Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration.from_pretrained(str(qwen_dir),
                                                              dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def config(qwen_dir) -> dict:
    return json.loads((qwen_dir / "config.json").read_text())


def _image(seed: int, height: int, width: int):
    from PIL import Image

    pixels = np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _chat_with_images(config: dict, count: int) -> list[int]:
    """Token ids of a rendered chat with `count` images, each as Qwen's template writes it."""
    image = [config["vision_start_token_id"], config["image_token_id"],
             config["vision_end_token_id"]]
    ids = [1, 28, 339, 198]
    for i in range(count):
        ids += image + [30 + i, 29]
    return ids + [2, 198, 1, 520, 198]


@pytest.fixture(scope="module")
def llm(qwen_dir):
    return make_llm(qwen_dir, kv_cache_memory="16MiB")


def test_its_config_is_read_as_a_qwen2_text_model_with_mrope_sections(qwen_dir):
    spec = ModelSpec.from_json(qwen_dir / "config.json")
    assert (spec.model_type, spec.multimodal_wrapper) == ("qwen2_5_vl_text", "qwen2_5_vl")
    assert spec.mrope_section == (2, 3, 3) and spec.qkv_bias and not spec.o_bias
    assert spec.head_dim == 16 and spec.num_layers == 2


def test_a_text_only_prompt_gives_transformers_tokens(llm, hf_model, chat_prompt_ids):
    prompt = chat_prompt_ids[0]
    ref = hf_greedy(hf_model, prompt, MAX_NEW, ignore_eos=True)
    out = llm.generate([prompt], PARAMS)[0].outputs[0]
    compare_greedy(out.token_ids, out.logprobs, ref)


class _Image:
    def __init__(self, offset: int, length: int, grid_thw: tuple[int, int, int]) -> None:
        self.offset, self.length, self.grid_thw = offset, length, grid_thw


def test_mrope_positions_equal_transformers_rope_index(hf_model):
    # Text, a 2x3-merged image, text, a 1x1-merged image, text.
    image_id = hf_model.config.image_token_id
    ids = [5] * 3 + [image_id] * 6 + [7] * 4 + [image_id] * 1 + [9] * 2
    types = [int(t == image_id) for t in ids]
    grids = [(1, 4, 6), (1, 2, 2)]
    ref, ref_delta = hf_model.model.get_rope_index(
        torch.tensor([ids]), mm_token_type_ids=torch.tensor([types]),
        image_grid_thw=torch.tensor(grids))
    ours = mrope_positions(len(ids), [_Image(3, 6, grids[0]), _Image(13, 1, grids[1])], 2)
    np.testing.assert_array_equal(ours.prompt, ref[:, 0].numpy())
    assert ours.delta == int(ref_delta)
    later = ours.at(len(ids) - 1, 3)  # the last prompt token, then two generated ones
    np.testing.assert_array_equal(later[:, 0], ours.prompt[:, -1])
    np.testing.assert_array_equal(later[:, 1:], np.broadcast_to(
        np.arange(len(ids), len(ids) + 2) + ours.delta, (3, 2)))


def test_the_mrope_rotary_equals_transformers(qwen_dir, hf_model):
    from officellm.engine.models.rotary import RotaryTable

    spec = ModelSpec.from_json(qwen_dir / "config.json")
    table = RotaryTable(spec, spec.layer_rope(0), 64, torch.device("cpu"))
    positions = torch.tensor([[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]])
    cos, sin = table.lookup(positions)
    ref_cos, ref_sin = hf_model.model.language_model.rotary_emb(
        torch.zeros(1, dtype=torch.float32), positions[:, None, :])
    assert torch.equal(cos, ref_cos[0]) and torch.equal(sin, ref_sin[0])


def test_the_processor_expands_each_image_pad_as_qwens_processor_does(qwen_dir, config):
    from transformers import AutoImageProcessor

    from officellm.engine.multimodal.processor import load_multimodal_processor

    images = [_image(0, 56, 84), _image(1, 56, 56)]
    prompt = load_multimodal_processor(qwen_dir).process(_chat_with_images(config, 2), images)
    hf = AutoImageProcessor.from_pretrained(str(qwen_dir))(images=images, return_tensors="pt")
    # Qwen2_5_VLProcessor's rule: <|image_pad|> x grid_t * grid_h * grid_w / merge_size^2.
    pad = config["image_token_id"]
    expected: list[int] = []
    grids = iter(hf["image_grid_thw"].tolist())
    for token in _chat_with_images(config, 2):
        expected += [pad] * (int(np.prod(next(grids))) // 4) if token == pad else [token]
    assert prompt.token_ids == expected
    assert [im.grid_thw for im in prompt.images] == [(1, 4, 6), (1, 4, 4)]
    assert torch.equal(torch.cat([im.pixel_values for im in prompt.images]),
                       hf["pixel_values"])
    assert [prompt.token_ids[im.offset:im.end] == [pad] * im.length
            for im in prompt.images] == [True, True]


def test_the_vision_tower_equals_transformers(qwen_dir, config, hf_model):
    from officellm.engine.loading.model_loader import iter_safetensors
    from officellm.engine.models.vision.qwen2_5_vl import Qwen2_5_VLVisionTower
    from officellm.engine.models.weight_names import is_skipped
    from officellm.engine.multimodal.processor import load_multimodal_processor

    prompt = load_multimodal_processor(qwen_dir).process(
        _chat_with_images(config, 2), [_image(0, 56, 84), _image(1, 56, 56)])
    tower = Qwen2_5_VLVisionTower(config, torch.float32, torch.device("cpu"))
    assert tower.load_weights((n, t) for n, t in iter_safetensors(qwen_dir)
                              if is_skipped(n)) > 0
    rows = tower.encode(prompt.images)
    with torch.inference_mode():
        ref = hf_model.model.get_image_features(
            torch.cat([im.pixel_values for im in prompt.images]),
            torch.tensor([im.grid_thw for im in prompt.images])).pooler_output
    assert [r.shape[0] for r in rows] == [im.length for im in prompt.images]
    assert all(torch.equal(a, b) for a, b in zip(rows, ref))



# -- generation with images -------------------------------------------------------------
BLOCK = 16


@torch.inference_mode()
def hf_greedy_with_images(model, prompt: MultiModalPrompt) -> HFGreedy:
    """transformers' greedy generate on the processed prompt (its pixels and grids, and the
    image tokens' types, from which it computes the M-RoPE positions)."""
    ids = torch.tensor([prompt.token_ids])
    out = model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids),
        pixel_values=torch.cat([im.pixel_values for im in prompt.images]),
        image_grid_thw=torch.tensor([im.grid_thw for im in prompt.images]),
        mm_token_type_ids=(ids == model.config.image_token_id).int(),
        do_sample=False, max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, eos_token_id=None,
        output_logits=True, return_dict_in_generate=True, pad_token_id=0,
        temperature=None, top_p=None, top_k=None)
    gen = out.sequences[0, ids.shape[1]:].tolist()
    return HFGreedy(gen, [torch.log_softmax(step[0].float(), dim=-1) for step in out.logits])


@pytest.fixture(scope="module")
def vision(qwen_dir, config, hf_model, chat_prompt_ids):
    """Prompts of the same token ids with an image from the second KV block on, whole blocks
    after it, the images of one shape but different pixels; a two-image prompt; their
    references."""
    from officellm.engine.multimodal.processor import load_multimodal_processor

    processor = load_multimodal_processor(qwen_dir)
    text = chat_prompt_ids[1]
    marker = [config["vision_start_token_id"], config["image_token_id"],
              config["vision_end_token_id"]]
    one = text[:BLOCK + 2] + marker + text[BLOCK + 2:]
    prompts = {name: processor.process(one, [_image(seed, 84, 112)])
               for seed, name in enumerate(("first", "other", "third"))}
    prompts["two"] = processor.process(one[:8] + marker + one[8:],
                                       [_image(5, 56, 84), _image(6, 84, 56)])
    image = prompts["first"].images[0]
    assert BLOCK < image.offset and image.end + BLOCK < len(prompts["first"].token_ids)
    assert len({p.images[0].content_hash for p in prompts.values()}) == 4
    return prompts, {k: hf_greedy_with_images(hf_model, p) for k, p in prompts.items()}


def _check(outputs, refs) -> None:
    for out, ref in zip(outputs, refs):
        compare_greedy(out.outputs[0].token_ids, out.outputs[0].logprobs, ref)


def test_a_prompt_with_an_image_gives_transformers_tokens(llm, vision):
    prompts, refs = vision
    assert llm.llm_engine.front_end.info.vision  # its tower and processor are loaded
    _check(llm.generate([prompts["first"]], PARAMS), [refs["first"]])


def test_images_batched_with_a_text_only_request_give_transformers_tokens(
        llm, vision, hf_model, chat_prompt_ids):
    prompts, refs = vision
    text = chat_prompt_ids[3]
    outputs = llm.generate([prompts["two"], text, prompts["other"]], PARAMS)
    _check(outputs, [refs["two"], hf_greedy(hf_model, text, MAX_NEW, ignore_eos=True),
                     refs["other"]])


def test_chunked_prefill_with_images_gives_transformers_tokens(qwen_dir, vision):
    prompts, refs = vision
    # 8-token chunks: each image is cut across two (its tokens attend causally, so may be).
    chunked = make_llm(qwen_dir, kv_cache_memory="16MiB", max_num_batched_tokens=8)
    image = prompts["first"].images[0]
    assert image.offset // 8 != (image.end - 1) // 8
    _check(chunked.generate([prompts["first"], prompts["two"]], PARAMS),
           [refs["first"], refs["two"]])


def test_the_same_image_hits_the_prefix_cache_and_a_different_one_misses(llm, vision):
    prompts, refs = vision
    kv = llm.llm_engine.engine_core.kv
    _check(llm.generate([prompts["first"]], PARAMS), [refs["first"]])
    hits = kv.prefix_cache_hits
    _check(llm.generate([prompts["first"]], PARAMS), [refs["first"]])
    assert kv.prefix_cache_hits - hits >= prompts["first"].images[0].end  # past the image
    hits = kv.prefix_cache_hits
    # The same token ids with an image never seen: only the blocks before the image hit.
    _check(llm.generate([prompts["third"]], PARAMS), [refs["third"]])
    assert 0 < kv.prefix_cache_hits - hits <= prompts["third"].images[0].offset
