"""GGUF files of every family, as llama.cpp's converter writes them (tests/support/
gguf_files.py), read by officellm's own reader (engine/loading/gguf_*.py): the config is the
model's, the dequantized tensors are exactly the file's values with the converter's transforms
undone, the blocks reach the right matmuls and experts, and the engine on the file answers as
the engine on a safetensors directory holding the dequantized values."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from officellm.engine import SamplingParams
from officellm.engine.kv_plan import load_spec
from officellm.engine.loading.gguf_checkpoint import gguf_tokenizer, hf_tensors
from officellm.engine.loading.gguf_config import hf_config
from officellm.engine.loading.gguf_layout import read_layout
from officellm.engine.loading.gguf_tensors import read_quantized
from officellm.engine.loading.model_loader import resolve_model_dir
from officellm.engine.loading.model_spec import ModelSpec, UnsupportedModelError
from officellm.engine.precision.weight_quantization import gguf_blocks
from officellm.kernels.reference import moe as moe_reference
from officellm.kernels.reference import quant_reference as qr
from officellm.kernels.reference.moe import ExpertWeights
from tests.engine.conftest import make_llm
from tests.support.gguf_files import (
    FAMILIES,
    MXFP4,
    VOCAB,
    build_gguf_model,
    small_tokenizer,
    write_gguf,
    write_reference_dir,
)

MOE_FAMILIES = ("qwen3_moe", "mixtral", "gpt_oss")
PROMPT = [1, 400, 500, 600, 700, 800, 33, 34]
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=5)
ENGINE = dict(attention_backend="torch", kv_cache_memory="4MiB", max_model_len=64)
# How far below the best logprob the dense reference's token may sit on the blocks' real
# path: its matmul rounds the activations to int8 per 32 values (as llama.cpp), Q4_K's
# offset term magnifying that (about 1.6% of a random layer's output).
NEAR_GREEDY = 0.75


@dataclass(frozen=True)
class GgufCase:
    kind: str
    quant: str
    model_dir: Path  # the Hugging Face model it was written from
    path: Path
    expected: dict[str, torch.Tensor]  # Hugging Face name -> the file's dequantized values


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory, smollm2_dir):
    """gguf_file(kind, quant, **types) -> GgufCase: each family's tiny model, built once,
    written once per quantization; engines on them convert into this module's own cache."""
    root = tmp_path_factory.mktemp("gguf-families")
    tokenizer = small_tokenizer(smollm2_dir, root / "tokenizer")
    models: dict[str, Path] = {}
    files: dict[tuple, GgufCase] = {}
    patch = pytest.MonkeyPatch()
    patch.setenv("OFFICELLM_CACHE_DIR", str(root / "cache"))

    def get(kind: str, quant: str, **types: int) -> GgufCase:
        key = (kind, quant, tuple(sorted(types.items())))
        if key not in files:
            if kind not in models:
                models[kind] = build_gguf_model(kind, root / kind, tokenizer)
            suffix = "".join(f"-{p}{t}" for p, t in sorted(types.items()))
            path = root / f"{kind}-{quant}{suffix}.gguf"
            files[key] = GgufCase(kind, quant, models[kind], path,
                                  write_gguf(models[kind], quant, path, types))
        return files[key]

    yield get
    patch.undo()


def _spec_fields(spec: ModelSpec) -> dict:
    """The spec's fields the engine uses (the dtype a file records aside)."""
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.compare}
    fields.pop("torch_dtype")
    return fields


# -- the config --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", FAMILIES)
def test_the_config_read_from_the_gguf_is_the_models(gguf_file, kind):
    case = gguf_file(kind, "q4_k_m")
    from_gguf = ModelSpec.from_config_dict(hf_config(read_layout(case.path)))
    assert _spec_fields(from_gguf) == _spec_fields(ModelSpec.from_json(case.model_dir /
                                                                       "config.json"))


def test_officellm_plan_reads_a_gguf_of_any_family(gguf_file):
    case = gguf_file("granite", "q4_k_m")  # transformers' GGUF loader has no granite
    spec, name = load_spec(str(case.path))
    assert name == case.path.stem
    assert _spec_fields(spec) == _spec_fields(ModelSpec.from_json(case.model_dir / "config.json"))


def test_llama3_rope_settings_come_back_from_the_stored_factors(tmp_path):
    """Llama 3.1 8B's rope_scaling, from the per-frequency factors its converter stores."""
    import gguf
    import numpy as np

    theta, head_dim = 500000.0, 128
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
    wavelengths = 2 * np.pi / freqs
    smooth = (8192 / wavelengths - 1.0) / (4.0 - 1.0)
    factors = np.where(wavelengths < 8192 / 4.0, 1.0, np.where(
        wavelengths > 8192, 8.0, 1 / ((1 - smooth) / 8.0 + smooth)))
    writer = gguf.GGUFWriter(str(tmp_path / "llama31.gguf"), "llama")
    for add, value in ((writer.add_block_count, 1), (writer.add_embedding_length, 4096),
                       (writer.add_head_count, 32), (writer.add_head_count_kv, 8),
                       (writer.add_rope_freq_base, theta),
                       (writer.add_rope_dimension_count, head_dim)):
        add(value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4096), dtype=np.float16))
    writer.add_tensor("rope_freqs.weight", factors.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert hf_config(read_layout(tmp_path / "llama31.gguf"))["rope_scaling"] == {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}


def test_an_architecture_no_family_has_is_refused_with_the_list(tmp_path):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(tmp_path / "mamba.gguf"), "mamba")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="'mamba'.*gemma3.*gpt-oss.*qwen3moe"):
        resolve_model_dir(tmp_path / "mamba.gguf", tmp_path / "cache")


# -- the tensors -------------------------------------------------------------------------

@pytest.mark.parametrize("kind,quant", [(k, q) for k in FAMILIES for q in ("f16", "q4_k_m")]
                         + [("gpt_oss", "mxfp4")])
def test_the_dequantized_tensors_are_the_files_values_under_hugging_face_names(
        gguf_file, kind, quant):
    """Names, q/k row order, Gemma's norms, fused Phi-3 tensors, experts per expert or
    fused as gpt-oss's: exactly the values the Hugging Face model holds after the file."""
    case = gguf_file(kind, quant)
    layout = read_layout(case.path)
    tensors = dict(hf_tensors(layout, hf_config(layout)))
    assert sorted(tensors) == sorted(case.expected)
    assert [n for n, t in tensors.items() if not torch.equal(t, case.expected[n])] == []


def _expected_experts(case: GgufCase, layer: int, num_experts: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(w13 [E, 2I, H], w2 [E, H, I]) of the expected tensors, in ExpertWeights' layout."""
    p = f"model.layers.{layer}."
    got = case.expected
    if case.kind == "gpt_oss":
        gate_up = got[p + "mlp.experts.gate_up_proj"].transpose(1, 2)  # [E, 2I, H] interleaved
        return (torch.cat([gate_up[:, 0::2], gate_up[:, 1::2]], dim=1),
                got[p + "mlp.experts.down_proj"].transpose(1, 2))
    names = (("block_sparse_moe.experts.{}.w1", "block_sparse_moe.experts.{}.w3",
              "block_sparse_moe.experts.{}.w2") if case.kind == "mixtral" else
             ("mlp.experts.{}.gate_proj", "mlp.experts.{}.up_proj", "mlp.experts.{}.down_proj"))
    w = [[got[f"{p}{n.format(e)}.weight"] for e in range(num_experts)] for n in names]
    return (torch.stack([torch.cat([g, u]) for g, u in zip(w[0], w[1])]), torch.stack(w[2]))


@pytest.mark.parametrize("kind", FAMILIES)
def test_the_blocks_are_read_under_the_decoders_names_in_hugging_face_row_order(
        gguf_file, kind):
    """Every matmul of the Q4_K_M file (Q4_K, Q6_K) in its blocks, dequantizing to the
    expected weights: fused Phi-3 rows as stored, llama-arch q/k rows put back, each MoE
    layer's experts as gate rows then up rows (w13) and down rows (w2)."""
    case = gguf_file(kind, "q4_k_m")
    config = json.loads((case.model_dir / "config.json").read_text())
    weights = read_quantized(case.path, config["num_attention_heads"],
                             config["num_key_value_heads"])
    assert not weights.unsupported and not weights.mixed_experts
    for name, q in weights.tensors.items():
        assert torch.equal(qr.dequantize(q.data, q.fmt), case.expected[name]), name
    matmuls = {n for n, t in case.expected.items() if t.dim() == 2
               and "norm" not in n and ".gate." not in n and ".router." not in n}
    embed = {"model.embed_tokens.weight"} | ({"lm_head.weight"}
                                             if "lm_head.weight" in case.expected else set())
    assert set(weights.tensors) == {n for n in matmuls if ".experts." not in n} | embed
    if kind not in MOE_FAMILIES:
        assert weights.experts == {}
        return
    experts = config.get("num_experts") or config["num_local_experts"]
    assert sorted(weights.experts) == list(range(config["num_hidden_layers"]))
    for layer, blocks in weights.experts.items():
        assert (blocks.fmt13, blocks.fmt2) == (qr.Q4_K, qr.Q6_K)
        w13, w2 = _expected_experts(case, layer, experts)
        assert torch.equal(torch.stack([qr.dequantize(b, blocks.fmt13) for b in blocks.w13]),
                           w13)
        assert torch.equal(torch.stack([qr.dequantize(b, blocks.fmt2) for b in blocks.w2]), w2)


def test_experts_whose_gate_and_up_differ_in_type_stay_dense_with_a_warning(gguf_file,
                                                                           caplog):
    case = gguf_file("qwen3_moe", "q4_k_m", ffn_up_exps=qr.Q8_0)
    with caplog.at_level(logging.WARNING, logger="officellm.engine.precision.weight_quantization"):
        weights = gguf_blocks(case.path, 8, 2)
    assert weights.experts == {} and weights.mixed_experts == [0, 1]
    assert any("gate and up in two block types" in r.getMessage() for r in caplog.records)


def test_experts_of_a_type_without_a_kernel_stay_dense_named_in_the_warning(gguf_file,
                                                                          caplog):
    import gguf

    case = gguf_file("mixtral", "q4_k_m", ffn_down_exps=int(gguf.GGMLQuantizationType.Q5_0))
    with caplog.at_level(logging.WARNING, logger="officellm.engine.precision.weight_quantization"):
        weights = gguf_blocks(case.path, 8, 2)
    assert weights.experts == {}
    assert weights.unsupported == {"Q5_0": ["model.layers.0.ffn_down_exps",
                                            "model.layers.1.ffn_down_exps"]}
    assert any("Q5_0" in r.getMessage() for r in caplog.records)


# -- the engine --------------------------------------------------------------------------

def _greedy(llm) -> tuple[list[int], list[dict[int, float]]]:
    out = llm.generate([PROMPT], GREEDY)[0].outputs[0]
    return out.token_ids, [{t: lp.logprob for t, lp in step.items()} for step in out.logprobs]


def _dequantizing(llm) -> None:
    """Every blocked matmul and expert of the engine dequantizes its blocks and runs the
    dense reference: the engine then computes what it would on the dequantized weights."""
    model = llm.llm_engine.engine_core.model
    weights: dict[int, torch.Tensor] = {}  # each group of blocks, dequantized once

    def matmul(x: torch.Tensor, w: torch.Tensor, fmt: int) -> torch.Tensor:
        if w.data_ptr() not in weights:
            weights[w.data_ptr()] = qr.dequantize(w, fmt)
        return F.linear(x, weights[w.data_ptr()])

    for module in (model.embed, model.lm_head, *(m for layer in model.layers
                                                 for m in layer.dense_matmuls())):
        if module.quantized is not None:
            module.quantized.matmul = matmul

    dense: dict[int, ExpertWeights] = {}  # each layer's experts, dequantized once

    def moe_experts(x, weights, ids, experts, activation):
        if experts.fmt13 is not None:
            key = experts.w13.data_ptr()
            if key not in dense:
                dense[key] = ExpertWeights(
                    torch.stack([qr.dequantize(w, experts.fmt13) for w in experts.w13]),
                    torch.stack([qr.dequantize(w, experts.fmt2) for w in experts.w2]),
                    b13=experts.b13, b2=experts.b2)
            experts = dense[key]
        return moe_reference.moe_experts(x, weights, ids, experts, activation)

    model.ops = dataclasses.replace(model.ops, moe_experts=moe_experts)


def _all_in_blocks(llm) -> bool:
    """Whether every layer's matmuls and experts read blocks, their dense copies released."""
    model = llm.llm_engine.engine_core.model
    matmuls = [m for layer in model.layers for m in layer.dense_matmuls()]
    experts = [layer.moe for layer in model.layers if layer.moe is not None]
    return (all(m.quantized is not None and m.weight.numel() == 0 for m in matmuls)
            and all(e.quantized is not None and e.w13.numel() == e.w2.numel() == 0
                    for e in experts))


def _check_engine_on_blocks(case: GgufCase) -> None:
    reference = _greedy(make_llm(write_reference_dir(
        case.model_dir, case.expected, case.path.with_suffix(".reference")), **ENGINE))
    llm = make_llm(case.path, quantization="gguf", **ENGINE)
    assert _all_in_blocks(llm)
    # Its real path: the reference's choice is the greedy one up to the int8 rounding of the
    # activations (where the two first differ; later steps see different prompts).
    tokens, logprobs = _greedy(llm)
    for ref_token, token, step in zip(reference[0], tokens, logprobs):
        assert step.get(ref_token, float("-inf")) >= step[token] - NEAR_GREEDY
        if ref_token != token:
            break
    _dequantizing(llm)
    assert_same_greedy(_greedy(llm), reference)


# How far the dequantizing run's logprobs may sit from the dense reference's: they were equal
# to the bit on the AVX-512 machines, and differed by up to 4.3e-6 on an AMD EPYC with AVX2
# only (qwen2 and gpt-oss, whose layers have biases; llama's were still equal), the float
# rounding of the same sums in another order inside torch's CPU matmul.
LOGPROB_ROUNDING = 1e-4


def assert_same_greedy(got: tuple[list[int], list[dict[int, float]]],
                       want: tuple[list[int], list[dict[int, float]]]) -> None:
    """The same greedy tokens, and at each step the same top logprobs up to rounding."""
    assert got[0] == want[0]
    for step, (mine, theirs) in enumerate(zip(got[1], want[1], strict=True)):
        assert mine.keys() == theirs.keys(), step
        for token, logprob in mine.items():
            assert logprob == pytest.approx(theirs[token], abs=LOGPROB_ROUNDING), (step, token)


@pytest.mark.parametrize("kind", FAMILIES)
def test_the_engine_on_a_gguf_in_blocks_answers_as_on_its_dequantized_weights(gguf_file,
                                                                              kind):
    _check_engine_on_blocks(gguf_file(kind, "q4_k_m"))


def test_gpt_oss_mxfp4_experts_run_in_blocks(gguf_file):
    if MXFP4 not in qr.GROUP_BYTES:
        pytest.skip("MXFP4 has no matmul reference on this branch yet "
                    "(kernels/reference/quant_reference.py): its experts are dequantized")
    _check_engine_on_blocks(gguf_file("gpt_oss", "mxfp4"))


def test_serving_a_gguf_converts_it_once_with_its_tokenizer_and_chat_template(gguf_file):
    case = gguf_file("phi3", "f16")
    model_dir = resolve_model_dir(case.path)
    assert resolve_model_dir(case.path) == model_dir
    assert (model_dir / "SOURCE").read_text().strip() == str(case.path.resolve())
    from transformers import AutoTokenizer

    chat = [{"role": "user", "content": "Hi!"}]
    original = AutoTokenizer.from_pretrained(str(case.model_dir))
    assert (make_llm(case.path, **ENGINE).apply_chat_template(chat)
            == original.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                            return_dict=False))


def test_a_tokenizer_json_beside_the_gguf_is_not_taken_for_its_own(gguf_file, tmp_path):
    import shutil

    path = tmp_path / "model.gguf"
    shutil.copy(gguf_file("qwen3", "f16").path, path)
    (tmp_path / "tokenizer.json").write_text("{}")  # another model's, or a broken one
    assert len(gguf_tokenizer(path)) == VOCAB


def test_a_conversion_by_the_former_reader_is_not_reused(gguf_file, tmp_path):
    """The former reader's directory for the same file (keyed without a reader version)."""
    import hashlib

    case = gguf_file("llama", "f16")
    st = case.path.stat()
    old_key = hashlib.sha256(f"{case.path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
                             .encode()).hexdigest()[:16]
    old = tmp_path / "gguf" / f"{case.path.stem}-{old_key}"
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    (old / "model.safetensors").write_bytes(b"")
    assert resolve_model_dir(case.path, tmp_path) != old


# -- tokenizers ---------------------------------------------------------------------------

SENTENCEPIECE = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)),
                 "\u2581", "h", "e", "l", "o", "w", "r", "d", "\u2581h", "\u2581he", "ll",
                 "llo", "\u2581hello", "\u2581w", "or", "\u2581wor", "ld", "\u2581world"]


@pytest.mark.parametrize("arch,tokens", [
    ("llama", ["<s>", "\u2581hello", "\u2581world"]),
    ("phi3", ["<s>", "\u2581hello", "\u2581world"]),
    ("gemma3", ["<s>", "h", "e", "llo", "\u2581world"]),  # Gemma prepends no space
])
def test_a_sentencepiece_vocabulary_converts_for_each_architecture_that_writes_one(
        tmp_path, arch, tokens):
    """Mistral, Mixtral, Llama 2, Gemma 3 and Phi-3 files store SentencePiece vocabularies
    (`tokenizer.ggml.model` llama); transformers builds each family's own from them."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(tmp_path / "sp.gguf"), arch)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(SENTENCEPIECE)
    writer.add_token_scores([0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(
        len(SENTENCEPIECE) - 259)])
    writer.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL,
                            gguf.TokenType.CONTROL, *[gguf.TokenType.BYTE] * 256,
                            *[gguf.TokenType.NORMAL] * (len(SENTENCEPIECE) - 259)])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    if arch == "gemma3":
        writer.add_add_space_prefix(False)
    writer.add_tensor("token_embd.weight", np.zeros((len(SENTENCEPIECE), 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tokenizer = gguf_tokenizer(tmp_path / "sp.gguf")
    ids = tokenizer.encode("hello world")
    assert tokenizer.convert_ids_to_tokens(ids) == tokens
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hello world"
