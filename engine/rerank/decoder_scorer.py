"""A decoder reranker (Qwen3-Reranker and its kind) on the engine: each query-document pair
is written into the model's judging prompt, and the score is the model's belief that the
answer is "yes": softmax([logit("no"), logit("yes")])["yes"] at the prompt's last position,
as Qwen3-Reranker's model card computes it.

It runs on the paged engine (LLMEngine), every pair one request of one token whose entry
carries the raw logprobs of "yes" and "no" (SamplingParams.logprob_token_ids), so the pairs
of a batch are scheduled together and a query's documents share the prompt's opening
(system prompt, instruction, query) through the prefix cache: the opening is computed once.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from pathlib import Path

from officellm.engine.config import EngineConfig
from officellm.engine.core.logprob import Logprob
from officellm.engine.frontend.output_processor import OutputKind
from officellm.engine.frontend.outputs import RequestOutput
from officellm.engine.frontend.sampling_params import SamplingParams
from officellm.engine.llm_engine import LLMEngine
from officellm.engine.rerank.scorer import RerankerInfo, ScoredPair

# Qwen3-Reranker's model card: its prompt, around "<Instruct>: ...\n<Query>: ...\n<Document>: ...".
PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the "
          "Query and the Instruct provided. Note that the answer can only be \"yes\" or "
          "\"no\".<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = ("Given a web search query, retrieve relevant passages that answer the "
                       "query")
# The card's max_length: a pair longer than this (or than the model's context) is cut at the end.
MAX_INPUT_TOKENS = 8192
# A reranker's KV pool when the server's knobs name none: a batch of 64 pairs of ~1k tokens.
DEFAULT_KV_CACHE_MEMORY = "1GiB"


def judged_text(query: str, document: str, instruction: str = DEFAULT_INSTRUCTION) -> str:
    """The user turn's text for one pair (the card's format_instruction)."""
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"


def yes_probability(yes: float, no: float) -> float:
    """softmax([no, yes])[yes] from the two logits (or logprobs: the same difference),
    without overflow however far apart they are."""
    gap = no - yes
    if gap > 0:
        return math.exp(-gap) / (1.0 + math.exp(-gap))
    return 1.0 / (1.0 + math.exp(gap))


class DecoderScorer:
    """One decoder reranker directory on its own LLMEngine, built from `config` (the server's
    knobs; None: the defaults, on the CPU), its model set to the directory."""

    def __init__(self, model_dir: str | Path, config: EngineConfig | None = None) -> None:
        self.model_dir = Path(model_dir)
        config = config or EngineConfig()
        if config.kv_cache_memory is None:
            config = replace(config, kv_cache_memory=DEFAULT_KV_CACHE_MEMORY)
        self.engine = LLMEngine(replace(config, model=str(self.model_dir)))
        tokenizer = self.engine.tokenizer
        self._prefix = tokenizer.encode(PREFIX, add_special_tokens=False)
        self._suffix = tokenizer.encode(SUFFIX, add_special_tokens=False)
        self.yes_id, self.no_id = (self._token_id(tokenizer, "yes"),
                                   self._token_id(tokenizer, "no"))
        # One token must still fit after the prompt.
        limit = min(self.engine.max_model_len - 1, MAX_INPUT_TOKENS)
        self.info = RerankerInfo(max_input_tokens=limit, scorer="decoder")
        self._body_limit = limit - len(self._prefix) - len(self._suffix)
        self._params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=0,
                                      logprob_token_ids=[self.no_id, self.yes_id],
                                      ignore_eos=True)
        self._ids = itertools.count()

    @staticmethod
    def _token_id(tokenizer, token: str) -> int:
        found = tokenizer.convert_tokens_to_ids(token)
        if found is None or found == tokenizer.unk_token_id:
            raise ValueError(f"The tokenizer has no token {token!r}: not a yes/no decoder "
                             "reranker.")
        return int(found)

    def prompt_ids(self, query: str, document: str) -> list[int]:
        """The pair's prompt as the card builds it: the opening's tokens, the judged text's
        (its end cut past the limit), the closing's."""
        body = self.engine.tokenizer.encode(judged_text(query, document),
                                            add_special_tokens=False)
        return self._prefix + body[:self._body_limit] + self._suffix

    def score(self, pairs: list[tuple[str, str]]) -> list[ScoredPair]:
        """Every pair a one-token request on the engine; each score the softmax of the "no"
        and "yes" logits' "yes". Each query's first pair runs first, then all the others
        together, which find that pair's opening (its system prompt, instruction and
        query) in the prefix cache: pairs prefilled in one step could not share it."""
        prompts = [self.prompt_ids(q, d) for q, d in pairs]
        firsts: dict[str, int] = {}
        for i, (query, _) in enumerate(pairs):
            firsts.setdefault(query, i)
        leading = sorted(firsts.values())
        following = sorted(set(range(len(pairs))) - set(leading))
        entries = {**self._run({i: prompts[i] for i in leading}),
                   **self._run({i: prompts[i] for i in following})}
        return [ScoredPair(yes_probability(entries[i][self.yes_id].logprob,
                                           entries[i][self.no_id].logprob), len(prompts[i]))
                for i in range(len(pairs))]

    def _run(self, prompts: dict[int, list[int]]) -> dict[int, dict[int, Logprob]]:
        """Run the prompts (by their pair's index) together, one token each; their one
        sampled position's logprobs entry (which holds "yes" and "no")."""
        ids = {f"rerank-{next(self._ids)}": i for i in prompts}
        for rid, i in ids.items():
            self.engine.add_request(rid, prompts[i], self._params,
                                    output_kind=OutputKind.FINAL)
        done: dict[str, RequestOutput] = {}
        try:
            while len(done) < len(ids):
                if not self.engine.has_unfinished_requests():
                    raise RuntimeError("The reranker's engine went idle with pairs unscored.")
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
        except BaseException:
            for rid in ids:
                if rid not in done:
                    self.engine.abort_request(rid)
            raise
        entries = {}
        for rid, out in done.items():
            if out.error:
                raise RuntimeError(f"Scoring failed: {out.error}")
            entries[ids[rid]] = out.outputs[0].logprobs[0]
        return entries

    def close(self) -> None:
        """Stop the engine's worker processes, if any (idempotent)."""
        self.engine.close()
