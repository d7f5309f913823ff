"""Batched sampling on the logits' device: penalties, greedy, temperature, top-k/p, min-p, seeds."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from officellm.engine.core.scheduler_output import SamplerOutput
from officellm.engine.structured_output.bitmask import GrammarBitmask
from officellm.engine.worker.host_to_device import to_device
from officellm.engine.worker.pending_samples import PendingSamples, RowLogprobs
from officellm.engine.worker.sampling_metadata import SamplingMetadata, SamplingRow


class Sampler:
    """Samples one token per row of a [S, V] float32 logits tensor.

    Each seeded request owns a torch.Generator, and draws its noise from it alone, so its
    tokens are the same whatever else shares the batch. Logprobs are those of the raw model
    distribution (before penalties and temperature), as vLLM returns by default. Rows past
    the sampled ones are prompt logprobs' rows (SamplingMetadata.prompt_rows): each scored at
    the prompt token that follows its position, never sampled.

    On a GPU the host reads the device once per step, for the sampled tokens and the rows
    that held NaN together (plus the logprobs' values when asked for): every decision taken
    before that is made from the host's own knowledge of the batch or done on the device
    for all rows, and per-row parameters go up through host_to_device.
    """

    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self._request_generators: dict[str, torch.Generator] = {}

    def release(self, request_ids: Iterable[str]) -> None:
        """Forget the generators of requests that finished."""
        for rid in request_ids:
            self._request_generators.pop(rid, None)

    def _generator_for(self, req: SamplingRow) -> torch.Generator | None:
        if req.seed is None:
            return None
        g = self._request_generators.get(req.request_id)
        if g is None:
            g = torch.Generator().manual_seed(req.seed)
            self._request_generators[req.request_id] = g
        return g

    def __call__(self, logits: torch.Tensor, sampling: SamplingMetadata,
                 grammar: GrammarBitmask | None = None) -> SamplerOutput:
        """sample()'s result on the host (waits for the device)."""
        return self.sample(logits, sampling, grammar).result()

    def sample(self, logits: torch.Tensor, sampling: SamplingMetadata,
               grammar: GrammarBitmask | None = None) -> PendingSamples:
        """One token per row (`sampling` says whose), left on the device; `grammar` masks
        the constrained rows (after the raw logprobs are taken, so those stay the model's
        own)."""
        requests = sampling.rows
        prompt_logprobs = None
        if sampling.prompt_rows:
            # The rows after the sampled ones: their raw logprobs are all they are for.
            prompt_logprobs = self._prompt_logprobs(logits[len(requests):], sampling)
            logits = logits[:len(requests)]
        # A row holding NaN fails its request. Its max is NaN exactly then: one reduction,
        # 4-16x cheaper on a CPU than isnan().any() (8.4 -> 1.7 ms at 64 x 49k).
        nan_rows = logits.amax(dim=-1).isnan()
        if logits.device.type == "cpu":
            # Asking is free here, and a copy of every row is not (12 MB at 64 x 49k).
            if bool(nan_rows.any()):
                logits = logits.masked_fill(nan_rows.unsqueeze(1), 0.0)
        else:
            # On a GPU asking would wait for the step's kernels: zero the NaN rows, if any.
            logits = logits.masked_fill(nan_rows.unsqueeze(1), 0.0)
        params = [r.params for r in requests]
        want_logprobs = [p.logprobs for p in params]
        raw_logprobs = None
        if any(k is not None for k in want_logprobs):
            raw_logprobs = torch.log_softmax(logits, dim=-1)

        logits = self._apply_penalties(logits, requests)
        logits = self._apply_min_tokens(logits, requests)
        if grammar is not None:
            _apply_grammar(logits, grammar)

        greedy = [p.greedy for p in params]
        if all(greedy):
            tokens = logits.argmax(dim=-1)
        else:
            tokens = self._sample(logits, requests, greedy)
        logprobs = named = None
        named_ids = [p.logprob_token_ids for p in params]
        if raw_logprobs is not None:
            logprobs = self._logprobs_of(raw_logprobs, tokens, max(k or 0 for k in want_logprobs))
            if any(named_ids):
                named = self._named_logprobs(raw_logprobs, named_ids)
        # The step's one read of the device, when the result is read: the tokens, the NaN
        # flags and any logprobs, prompt logprobs too, come back together.
        return PendingSamples(tokens, nan_rows, logprobs, want_logprobs, prompt_logprobs,
                              sampling.prompt_rows, named, named_ids)

    # -- logits processing -------------------------------------------------------------
    @staticmethod
    def _apply_penalties(logits: torch.Tensor, requests: list[SamplingRow]) -> torch.Tensor:
        rows = [i for i, r in enumerate(requests) if r.params.uses_penalties]
        if not rows:
            return logits
        logits = logits.clone()
        vocab = logits.shape[1]
        for i in rows:
            p = requests[i].params
            row = logits[i]
            if p.repetition_penalty != 1.0:
                # As transformers: over prompt and output, divide positive logits, multiply negative.
                # Filtered here, not by a mask on the device (which would wait for the GPU).
                seen = to_device(sorted(t for t in set(requests[i].all_token_ids) if t < vocab),
                                 torch.long, logits.device)
                vals = row[seen]
                row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            if (p.presence_penalty or p.frequency_penalty) and requests[i].output_token_ids:
                # As OpenAI: over generated tokens only.
                # Built where the logits are (a GPU's): a host tensor here failed on CUDA.
                out = to_device(requests[i].output_token_ids, torch.long, logits.device)
                counts = torch.zeros(vocab, dtype=logits.dtype, device=logits.device).scatter_add_(
                    0, out, torch.ones_like(out, dtype=logits.dtype)
                )
                row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
        return logits

    @staticmethod
    def _apply_min_tokens(logits: torch.Tensor, requests: list[SamplingRow]) -> torch.Tensor:
        rows = [
            i for i, r in enumerate(requests)
            if r.num_output_tokens < r.params.min_tokens
        ]
        if not rows:
            return logits
        logits = logits.clone()
        for i in rows:
            r = requests[i]
            banned = set(r.params.stop_token_ids)
            if not r.params.ignore_eos:
                banned |= set(r.eos_token_ids)
            if banned:
                logits[i, to_device(sorted(banned), torch.long, logits.device)] = float("-inf")
        return logits

    def _sample(self, logits: torch.Tensor, requests: list[SamplingRow], greedy: list[bool]) -> torch.Tensor:
        params = [r.params for r in requests]
        device = logits.device
        temps = to_device([1.0 if g else p.temperature for p, g in zip(params, greedy)],
                          torch.float32, device)
        scaled = logits / temps.unsqueeze(1)
        need_sort = any(p.top_k > 0 or p.top_p < 1.0 for p in params)
        if need_sort:
            scaled = self._top_k_top_p(scaled, params)
        if any(p.min_p > 0 for p in params):
            min_p = to_device([p.min_p for p in params], torch.float32, device).unsqueeze(1)
            probs = scaled.softmax(-1)
            scaled = scaled.masked_fill(probs < min_p * probs.max(-1, keepdim=True).values, float("-inf"))
        probs = scaled.softmax(-1)
        # Inverse-CDF sampling: one uniform per row (drawing a noise value per vocabulary
        # entry, as the exponential race does, cost 17 ms a step at 16 x 49k on one core).
        uniforms = torch.empty(len(requests), dtype=torch.float32)
        unseeded = [i for i, r in enumerate(requests) if r.seed is None]
        if unseeded:
            uniforms[unseeded] = torch.rand(len(unseeded), generator=self.generator)
        for i, r in enumerate(requests):
            g = self._generator_for(r)
            if g is not None:
                uniforms[i] = torch.rand(1, generator=g)
        drafted = [i for i, r in enumerate(requests) if r.draft_token is not None
                   and not greedy[i]]
        if drafted:
            # Rejection sampling against a draft d (a one-hot proposal): keep d with
            # probability p(d), else draw from p without d. The row's token is then exactly
            # distributed as p, as without speculation; it equals d only if d was kept.
            drafts = to_device([requests[i].draft_token for i in drafted], torch.long, device)
            rows = to_device(drafted, torch.long, device)
            keep_u = torch.empty(len(drafted), dtype=torch.float32)
            for j, i in enumerate(drafted):
                g = self._generator_for(requests[i])
                keep_u[j] = torch.rand(1, generator=g if g is not None else self.generator)
            p_draft = probs[rows, drafts] / probs[rows].sum(-1)
            kept = to_device(keep_u, torch.float32, device) < p_draft
            probs = probs.clone()
            probs[rows, drafts] = 0.0  # the draft was not kept: what the row draws instead
        sampled, broken = self._inverse_cdf(probs, uniforms, logits.shape[1])
        if drafted:
            sampled[rows] = torch.where(kept, drafts, sampled[rows])
            broken[rows] &= ~kept
        # Greedy rows and broken rows take the argmax; chosen on the device for every row
        # (asking the device whether any row is broken would be a wait).
        take_argmax = broken | to_device(greedy, torch.bool, device)
        return torch.where(take_argmax, logits.argmax(dim=-1), sampled)

    @staticmethod
    def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor,
                     vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's token at its uniform's place in its (unnormalised) distribution, and
        the rows that have no finite distribution to draw from."""
        device = probs.device
        cdf = probs.cumsum(dim=-1)
        total = cdf[:, -1:]
        # Strictly inside the mass: u * total can round up to total when u is near 1.
        target = torch.minimum(to_device(uniforms, torch.float32, device).unsqueeze(1) * total,
                               torch.nextafter(total, torch.zeros_like(total)))
        # right=True: the first token whose cumulative mass exceeds the target, so tokens of
        # zero probability (masked by top-k/top-p/min-p) are never chosen.
        sampled = torch.searchsorted(cdf, target, right=True).squeeze(1)
        # A row with no finite distribution (a temperature so small that logits / T
        # overflowed) has no CDF to search: it takes its most likely token.
        mass = total.squeeze(1)
        broken = ~torch.isfinite(mass) | (mass <= 0)
        return sampled.clamp_(max=vocab - 1), broken

    @staticmethod
    def _top_k_top_p(scaled: torch.Tensor, params) -> torch.Tensor:
        vocab = scaled.shape[1]
        device = scaled.device
        top_k = to_device([p.top_k if p.top_k > 0 else vocab for p in params], torch.long, device)
        top_p = to_device([p.top_p for p in params], torch.float32, device)
        sorted_logits, sorted_idx = scaled.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=device).unsqueeze(0)
        remove = ranks >= top_k.unsqueeze(1)
        probs = sorted_logits.softmax(-1)
        # Keep the smallest set whose mass reaches top_p (the first token always stays).
        mass_before = probs.cumsum(-1) - probs
        remove |= mass_before >= top_p.unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        return torch.empty_like(scaled).scatter_(1, sorted_idx, sorted_logits)

    @classmethod
    def _prompt_logprobs(cls, logits: torch.Tensor, sampling: SamplingMetadata) -> RowLogprobs:
        """On the device, for the prompt logprobs' rows: the raw logprob (float32, before
        any penalty or temperature, as the sampled rows') and rank of the prompt token each
        row is scored at, and the rows' best logprobs and their ids."""
        raw = torch.log_softmax(logits.float(), dim=-1)
        targets = to_device([t for rows in sampling.prompt_rows for t in rows.next_token_ids],
                            torch.long, logits.device)
        return cls._logprobs_of(raw, targets, max(r.num_top for r in sampling.prompt_rows))

    @staticmethod
    def _named_logprobs(raw: torch.Tensor,
                        named_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor,
                                                             torch.Tensor]:
        """On the device: each row's SamplingParams.logprob_token_ids' raw logprobs and ranks
        ([rows, widest], rows with fewer padded with token 0) and the ids themselves."""
        width = max(len(ids) for ids in named_ids)
        ids = to_device([[*row, *[0] * (width - len(row))] for row in named_ids], torch.long,
                        raw.device)
        vals = raw.gather(1, ids)
        # A column at a time: a [rows, width, vocab] comparison would hold it all at once.
        ranks = torch.stack([(raw > vals[:, j:j + 1]).sum(-1) + 1 for j in range(width)], 1)
        return vals, ranks, ids

    @staticmethod
    def _logprobs_of(raw: torch.Tensor, tokens: torch.Tensor,
                     max_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """On the device: each row's chosen token's logprob and rank (1 = most likely), and
        its `max_k` best logprobs and their ids."""
        top_vals, top_idx = raw.topk(max_k, dim=-1)
        chosen = raw.gather(1, tokens.unsqueeze(1)).squeeze(1)
        ranks = (raw > chosen.unsqueeze(1)).sum(-1) + 1
        return chosen, ranks, top_vals, top_idx


def _apply_grammar(logits: torch.Tensor, grammar: GrammarBitmask) -> None:
    """Set the logits of the tokens the grammar disallows to -inf, in place, on its rows."""
    import xgrammar as xgr  # loaded by the first grammar (engine/structured_output/request_grammar.py)

    # Through pinned memory: a copy from pageable memory would wait for the device.
    xgr.apply_token_bitmask_inplace(logits, to_device(grammar.bitmask, torch.int32,
                                                      logits.device), indices=grammar.rows)
