"""Random-weight models shaped like shipped configs, shared by transformers and the engine.

The device has no internet and no weights: a model is built from a shipped config with
random weights (transformers' own module, on the GPU), and the engine loads the very same
tensors from memory, so both sides of every comparison run identical weights. The model
directory holds only config.json and a word-level tokenizer that names every id of the
vocabulary ("t123"), so the engine can detokenize whatever it generates.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

CONFIG_DIR = Path(__file__).resolve().parents[2] / "engine" / "model_configs"

# Smoke-test shape (CPU): the family's structure at toy size.
SMOKE_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=8, num_key_value_heads=2, vocab_size=512)


def hf_config(name: str, smoke: bool = False) -> Any:
    """A transformers config object from engine/model_configs/<name>.json."""
    from transformers import AutoConfig

    raw = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    raw.pop("architectures", None)
    raw.pop("torch_dtype", None)
    if smoke:
        raw.update(SMOKE_SHAPE)
    raw.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return AutoConfig.for_model(raw.pop("model_type"), **raw)


def random_hf_model(config: Any, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """transformers' model with random weights, initialized on `device` (fast on a GPU).

    Larger-than-default weights give peaked next-token distributions, so greedy parity
    measures the engine rather than coin flips between near-equal logits.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2 if "embed" in name or "lm_head" in name else 0.04)
            elif "norm" not in name:
                p.normal_(0.0, 0.05)
    return model.eval()


def write_model_dir(config: Any, out_dir: Path) -> Path:
    """config.json plus a tokenizer covering the whole vocabulary; no weight files."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(out_dir))
    vocab = {f"t{i}": i for i in range(config.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0",
                                   bos_token="t1", eos_token="t2")
    fast.save_pretrained(str(out_dir))
    return out_dir


@contextmanager
def weights_from(model: torch.nn.Module):
    """While active, the engine loads its weights from `model` instead of safetensors."""
    import officellm.engine.worker.worker as worker  # where the engine (each rank's Worker) loads weights

    original = worker.iter_weights
    worker.iter_weights = lambda _dir, skip=frozenset(): (
        (k, v) for k, v in model.state_dict().items() if "rotary_emb" not in k and k not in skip)
    try:
        yield
    finally:
        worker.iter_weights = original


def build_engine(model: torch.nn.Module, model_dir: Path, **config: Any):
    """An LLMEngine over `model`'s weights (config keys as EngineConfig's)."""
    from contextlib import nullcontext

    from officellm.engine.llm_engine import LLMEngine

    # On a GPU, the engine's modules are created there directly: initializing 7B parameters
    # on the host and copying them over would cost tens of seconds of the check's budget.
    where = torch.device("cuda") if config.get("device") == "cuda" else nullcontext()
    with weights_from(model), where:
        return LLMEngine(model=str(model_dir), **config)


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()


def free_cuda() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
