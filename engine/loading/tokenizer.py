"""The model's tokenizer, as transformers' AutoTokenizer chooses it, loaded without importing
the model family's config class where that choice does not need it.

AutoTokenizer first loads the model's config through AutoConfig, which imports the family's
config module and with it transformers' modeling stack (torch.distributed.tensor included):
about half of a server's start-up after uvicorn listens, on a small CPU. It reads only a few
fields of that config (model_type, tokenizer_class, the model's name) when the tokenizer's own
config names its class, so a plain PreTrainedConfig made from config.json chooses the same
class. A tokenizer config that names no class, or brings its own code (auto_map), needs the
family's config class to choose one: those go through AutoConfig as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from officellm.engine.loading.transformers_lock import TRANSFORMERS

_CHOICE_FIELDS = ("model_type", "tokenizer_class", "architectures", "_name_or_path")


def load_tokenizer(model_dir: Path) -> Any:
    """The tokenizer of the Hugging Face model directory `model_dir` (with its chat
    template), the class AutoTokenizer would pick."""
    with TRANSFORMERS:
        from transformers import AutoTokenizer, PreTrainedConfig

        tokenizer_config = model_dir / "tokenizer_config.json"
        named = {}
        if tokenizer_config.is_file():
            named = json.loads(tokenizer_config.read_text(encoding="utf-8"))
        if not named.get("tokenizer_class") or "auto_map" in named:
            return AutoTokenizer.from_pretrained(str(model_dir))
        raw = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        # Only the fields the choice reads: a plain config cannot take every family's others
        # (rope_scaling's old spelling needs the family's max_position_embeddings handling).
        config = PreTrainedConfig.from_dict({k: raw[k] for k in _CHOICE_FIELDS if k in raw})
        config._name_or_path = str(model_dir)
        return AutoTokenizer.from_pretrained(str(model_dir), config=config)
