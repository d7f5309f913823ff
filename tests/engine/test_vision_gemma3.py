"""Images in prompts on Gemma 3: a tiny random Gemma3ForConditionalGeneration (the scaled-down
real config: SigLIP on 112-pixel images in 14-pixel patches, pooled to 16 tokens an image, a
four-layer language model with 16-token sliding windows) gives transformers' own greedy
tokens (float32) for the same processed inputs, alone, batched with text-only requests,
under chunked prefill and from a prefix-cache hit on the same image; a different image
with the same token ids misses the blocks its placeholders are in."""

from __future__ import annotations

import json

import msgspec
import pytest
import torch
from PIL import Image

from officellm.engine import ImageInputError, MultiModalPrompt, SamplingParams
from officellm.engine.core.request import EngineCoreRequest
from officellm.engine.core_client import wire
from tests.engine.conftest import make_llm
from tests.support.hf_reference import HFGreedy, compare_greedy, hf_greedy
from tests.support.tiny_models import build_tiny_gemma3_vision

MAX_NEW = 8
BLOCK = 16
PARAMS = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2)


def _image(seed: int) -> Image.Image:
    """A small noisy RGB picture (a different one per seed), not of the tower's size."""
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (40, 60, 3), generator=g, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


@pytest.fixture(scope="module")
def vision(tmp_path_factory, smollm2_dir, smollm2_tokenizer):
    """The checkpoint, transformers' model on it, the engine's processor, and token ids
    around one image marker: the image's placeholders straddle a block boundary."""
    from transformers import Gemma3ForConditionalGeneration

    from officellm.engine import load_multimodal_processor

    model_dir = build_tiny_gemma3_vision(tmp_path_factory.mktemp("gemma3-vision") / "model",
                                         smollm2_dir, image_size=112, mm_tokens_per_image=16)
    config = json.loads((model_dir / "config.json").read_text())
    hf = Gemma3ForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32)
    processor = load_multimodal_processor(model_dir)
    assert processor is not None
    tok = smollm2_tokenizer
    # 18 tokens: the image's placeholders are positions [20, 36), across the second block's end
    before = tok.encode("User: what does this scanned invoice say? Here it is, the whole first page:")
    after = tok.encode(" Please read the total amount and the date aloud.\nAssistant:")
    return model_dir, config, hf.eval(), processor, before, [config["boi_token_index"]], after


def _prompt(vision, image: Image.Image, after: list[int] | None = None) -> MultiModalPrompt:
    _, _, _, processor, before, marker, default_after = vision
    return processor.process(before + marker + (after or default_after), [image])


@torch.inference_mode()
def _hf_greedy(vision, mm: MultiModalPrompt) -> HFGreedy:
    """transformers' greedy generate with the same pixels and the image tokens marked in
    token_type_ids (Gemma3ForConditionalGeneration's bidirectional mask)."""
    _, config, hf, *_ = vision
    ids = torch.tensor([mm.token_ids])
    out = hf.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids),
        pixel_values=torch.cat([i.pixel_values for i in mm.images]),
        token_type_ids=(ids == config["image_token_index"]).long(), do_sample=False,
        max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, eos_token_id=None,
        output_logits=True, return_dict_in_generate=True, pad_token_id=0, temperature=None,
        top_p=None, top_k=None)
    gen = out.sequences[0, ids.shape[1]:].tolist()
    return HFGreedy(gen, [torch.log_softmax(s[0].float(), dim=-1) for s in out.logits])


@pytest.fixture(scope="module")
def cases(vision):
    """Two images behind the same text, and the references of each (and of the text alone)."""
    first, second = _prompt(vision, _image(1)), _prompt(vision, _image(2))
    assert first.token_ids == second.token_ids
    text = vision[4] + vision[6]
    refs = [_hf_greedy(vision, first), _hf_greedy(vision, second),
            hf_greedy(vision[2], text, MAX_NEW, ignore_eos=True)]
    # The image decides the answer: otherwise these tests could pass without it.
    assert refs[0].token_ids != refs[1].token_ids
    return first, second, text, refs


def _check(output, ref: HFGreedy) -> None:
    compare_greedy(output.outputs[0].token_ids, output.outputs[0].logprobs, ref)


@pytest.fixture(scope="module")
def llm(vision):
    """One engine (default budget) for the tests that need no other settings: each sends
    what it needs cached first, so their order does not matter."""
    return make_llm(vision[0], kv_cache_memory="16MiB")


def test_the_processor_expands_each_image_marker_as_gemma3_processor_does(vision, cases):
    _, config, _, _, before, _, after = vision
    first = cases[0]
    image = first.images[0]
    newlines = vision[3].newlines
    assert image.offset == len(before) + len(newlines) + 1 and image.length == 16
    assert first.token_ids[image.offset - 1] == config["boi_token_index"]
    assert first.token_ids[image.offset:image.end] == [config["image_token_index"]] * 16
    assert first.token_ids[image.end] == config["eoi_token_index"]
    assert len(first.token_ids) == len(before) + 2 * len(newlines) + 18 + len(after)
    assert image.pixel_values.shape == (1, 3, 112, 112)
    # The same image hashes equal however often it is sent; another image differently.
    assert _prompt(vision, _image(1)).images[0].content_hash == image.content_hash
    assert cases[1].images[0].content_hash != image.content_hash


def test_markers_and_images_that_differ_in_number_are_refused(vision):
    _, _, _, processor, before, marker, _ = vision
    with pytest.raises(ImageInputError, match="2 image placeholders but 1 image"):
        processor.process(before + marker + marker, [_image(1)])


def test_an_image_crosses_the_process_wire_as_bytes(cases):
    first = cases[0]
    request = EngineCoreRequest("r", first.token_ids, PARAMS, multimodal=first)
    frame = msgspec.msgpack.encode(wire.Add([wire.WireRequest.of(request)]))
    back = msgspec.msgpack.Decoder(wire.Add).decode(frame).requests[0].core_request(None)
    assert back.multimodal is not None
    assert back.multimodal.images[0].content_hash == first.images[0].content_hash
    assert torch.equal(back.multimodal.images[0].pixel_values, first.images[0].pixel_values)


def test_an_image_prompt_alone_and_batched_with_text_matches_transformers(llm, cases):
    first, second, text, refs = cases
    assert llm.llm_engine.front_end.info.vision
    _check(llm.generate(multimodal=first, sampling_params=PARAMS)[0], refs[0])
    outputs = llm.generate([first, text, second], PARAMS)
    for output, ref in zip(outputs, [refs[0], refs[2], refs[1]]):
        _check(output, ref)
    cache = llm.llm_engine.engine_core.runner.encoder_cache
    assert cache is not None and cache.num_held == 0  # every image's rows were handed out


def test_an_image_is_never_split_across_prefill_chunks(vision, cases):
    """A 16-token budget: the chunk before the image ends at its first placeholder and the
    image runs whole in the next step (its tokens attend to each other both ways)."""
    first, second, text, refs = cases
    llm = make_llm(vision[0], kv_cache_memory="16MiB", max_num_batched_tokens=BLOCK)
    outputs = llm.generate([first, text, second], PARAMS)
    for output, ref in zip(outputs, [refs[0], refs[2], refs[1]]):
        _check(output, ref)


def test_a_step_budget_smaller_than_an_image_is_refused_at_load(vision):
    with pytest.raises(ValueError, match="must hold one image's 16 tokens"):
        make_llm(vision[0], kv_cache_memory="16MiB", max_num_batched_tokens=8)


def test_a_resent_image_hits_the_prefix_cache(llm, vision, cases):
    first, _, _, refs = cases
    kv = llm.llm_engine.engine_core.kv
    llm.generate(multimodal=first, sampling_params=PARAMS)
    hits = kv.prefix_cache_hits
    # The same picture decoded and processed again: equal pixels, equal hash.
    _check(llm.generate(multimodal=_prompt(vision, _image(1)), sampling_params=PARAMS)[0],
           refs[0])
    image = first.images[0]
    assert kv.prefix_cache_hits - hits >= (image.end // BLOCK) * BLOCK > image.offset


def test_another_image_behind_the_same_text_misses_the_blocks_it_is_in(llm, vision, cases):
    first = cases[0]
    kv = llm.llm_engine.engine_core.kv
    llm.generate(multimodal=first, sampling_params=PARAMS)
    other = _prompt(vision, _image(3))
    assert other.token_ids == first.token_ids
    hits = kv.prefix_cache_hits
    _check(llm.generate(multimodal=other, sampling_params=PARAMS)[0], _hf_greedy(vision, other))
    # Only the blocks before the image's first placeholder are the same KV.
    image = first.images[0]
    assert kv.prefix_cache_hits - hits == image.offset // BLOCK * BLOCK > 0


def test_a_prefix_hit_never_ends_inside_an_image(llm, vision, cases):
    """The same image, then other text: the shared full blocks end inside the image, so the
    hit backs off to the block before the image's start and the image is computed whole."""
    first = cases[0]
    other = _prompt(vision, _image(1), vision[4][:3])
    image = first.images[0]
    assert other.token_ids[:image.end] == first.token_ids[:image.end]
    shared = image.end + 2  # the end-of-image token and the newlines after it
    assert image.offset < shared // BLOCK * BLOCK < image.end
    kv = llm.llm_engine.engine_core.kv
    llm.generate(multimodal=first, sampling_params=PARAMS)
    hits = kv.prefix_cache_hits
    _check(llm.generate(multimodal=other, sampling_params=PARAMS)[0], _hf_greedy(vision, other))
    assert kv.prefix_cache_hits - hits == image.offset // BLOCK * BLOCK > 0


def test_a_model_without_vision_refuses_images(tmp_path_factory, smollm2_dir, cases):
    """The same checkpoint without its image processor's config: the engine serves its
    language model only, and a prompt with images is refused with a sentence."""
    from tests.support.tiny_models import shared_tiny_model

    model_dir = shared_tiny_model("gemma3", tmp_path_factory, smollm2_dir)
    assert not (model_dir / "preprocessor_config.json").exists()
    llm = make_llm(model_dir, kv_cache_memory="16MiB")
    assert not llm.llm_engine.front_end.info.vision
    assert llm.llm_engine.multimodal_processor is None
    with pytest.raises(ImageInputError, match="does not take images"):
        llm.generate(multimodal=cases[0], sampling_params=PARAMS)
