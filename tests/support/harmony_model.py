"""A tiny gpt-oss stand-in for the server tests: the bundled SmolLM2 tokenizer given harmony's
special tokens and a harmony chat template (chat_templates/gpt_oss.jinja), and a one-layer
Llama whose weights are solved, not trained, so that the engine's greedy decoding writes
given harmony turns token by token, special tokens included.

How the weights make it so. Only the tokens that matter are "tracked" (the turns' own
tokens, and the prompt tokens that tell the prompts apart: the question, the reasoning
effort); each has two one-hot directions, for "is the current token" (its embedding) and
"has been seen" (the embedding moved by the value projection). The attention's query and key
weights are zero, so every position attends evenly to all before it and itself: the
residual stream holds the current token plus the share of each tracked token in the text
so far, which tells apart every step of every turn (where a turn repeats a token, what came
between differs). The MLP is zero. The output head is then solved on those features, one
convex fit, for each step's next token with a margin over every other token (untracked
tokens keep a zero row: their logit is 0), scaled until the least margin is MIN_MARGIN.
Building takes seconds, not a training run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

HARMONY_SPECIAL_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                          "<|constrain|>", "<|return|>", "<|call|>"]
GPT_OSS_TEMPLATE = Path(__file__).parent / "chat_templates" / "gpt_oss.jinja"
# The least logit lead of each step's token over the runner-up (untracked tokens included:
# their logit is 0): float32 differences between the engine and transformers are orders of
# magnitude smaller.
MIN_MARGIN = 4.0


@dataclass(frozen=True)
class HarmonyTurn:
    """A prompt, as the server renders it (messages, tools, template arguments), and the
    turn the model answers it with, as text with its special tokens."""

    messages: list[dict[str, Any]]
    text: str
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)


def harmony_tokenizer(smollm2_dir: Path) -> Any:
    """SmolLM2's tokenizer with harmony's special tokens, gpt-oss's stop token and the
    harmony template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    tok.add_special_tokens({"additional_special_tokens": HARMONY_SPECIAL_TOKENS,
                            "eos_token": "<|return|>"})
    tok.chat_template = GPT_OSS_TEMPLATE.read_text()
    return tok


def _prompt(tok: Any, turn: HarmonyTurn) -> list[int]:
    ids = tok.apply_chat_template(turn.messages, tools=turn.tools, add_generation_prompt=True,
                                  tokenize=True, **turn.template_kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def build_harmony_model(out_dir: Path, smollm2_dir: Path, turns: list[HarmonyTurn]) -> Path:
    """Save the model (weights, tokenizer, generation config) that answers each turn's
    prompt with its text under greedy decoding."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = harmony_tokenizer(smollm2_dir)
    sequences = []
    for turn in turns:
        ids = tok.encode(turn.text, add_special_tokens=False)
        assert tok.decode(ids) == turn.text, "the turn must survive its own tokenization"
        sequences.append((_prompt(tok, turn), ids))
    prompts = [set(p) for p, _ in sequences]
    tracked = sorted({t for _, ids in sequences for t in ids}
                     | (set().union(*prompts) - set.intersection(*prompts)))
    width = -(-len(tracked) // 32) * 32
    config = LlamaConfig(vocab_size=len(tok), hidden_size=2 * width, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=4096, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(config).eval()
    rows = torch.tensor(tracked)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0 if name.endswith("norm.weight") else 0.0)
        model.model.embed_tokens.weight[rows, torch.arange(len(tracked))] = 1.0
        attention = model.model.layers[0].self_attn
        attention.v_proj.weight[torch.arange(width) + width, torch.arange(width)] = 1.0
        attention.o_proj.weight.copy_(torch.eye(2 * width))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # small tensors: more threads only wait on each other
        try:
            features, labels = _steps(model, sequences, rows)
            model.lm_head.weight[rows] = _fit(features, labels, len(tracked))
        finally:
            torch.set_num_threads(threads)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.save_pretrained(str(out_dir))
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>")]
    GenerationConfig(eos_token_id=stops, bos_token_id=tok.bos_token_id).save_pretrained(
        str(out_dir))
    return out_dir


def _steps(model: Any, sequences: list[tuple[list[int], list[int]]], rows: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The final hidden state at each generation step and the tracked index of its token."""
    index = {int(t): i for i, t in enumerate(rows)}
    features, labels = [], []
    for prompt, ids in sequences:
        hidden = model.model(torch.tensor([prompt + ids])).last_hidden_state[0]
        features.append(hidden[len(prompt) - 1:len(prompt) + len(ids) - 1])
        labels += [index[t] for t in ids]
    return torch.cat(features), torch.tensor(labels)


def _fit(features: torch.Tensor, labels: torch.Tensor, classes: int) -> torch.Tensor:
    """Output rows for the tracked tokens: multinomial logistic regression, every untracked
    token a fixed zero logit, then scaled until each step leads by MIN_MARGIN."""
    weights = torch.zeros(classes, features.shape[1], requires_grad=True)
    optimizer = torch.optim.LBFGS([weights], max_iter=500, line_search_fn="strong_wolfe")

    def logits(w: torch.Tensor) -> torch.Tensor:
        return torch.cat([features @ w.T, torch.zeros(len(features), 1)], dim=1)

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        value = torch.nn.functional.cross_entropy(logits(weights), labels)
        value.backward()
        return value

    with torch.enable_grad():
        optimizer.step(loss)
    w = weights.detach()
    margin = _margins(logits(w), labels).min().item()
    assert margin > 0, "the turns' steps are not separable: make the turns differ more"
    return w * (MIN_MARGIN / margin)


def _margins(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    chosen = logits.gather(1, labels[:, None])[:, 0]
    others = logits.scatter(1, labels[:, None], float("-inf"))
    return chosen - others.max(dim=1).values
