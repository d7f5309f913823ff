"""Batched sampling on the logits' device: penalties, greedy, temperature, top-k/p, min-p, seeds."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from officellm.engine.core.scheduler_output import Logprob, SamplerOutput
from officellm.engine.structured_output.bitmask import GrammarBitmask
from officellm.engine.worker.sampling_metadata import SamplingMetadata, SamplingRow


class Sampler:
    """Samples one token per row of a [S, V] float32 logits tensor.

    Each seeded request owns a torch.Generator, and draws its noise from it alone, so its
    tokens are the same whatever else shares the batch. Logprobs are those of the raw model
    distribution (before penalties and temperature), as vLLM returns by default.
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
        """One token per row (`sampling` says whose); `grammar` masks the constrained rows
        (after the raw logprobs are taken, so those stay the model's own)."""
        requests = sampling.rows
        num_rows, vocab = logits.shape
        nan_rows = torch.isnan(logits).any(dim=-1)
        invalid = nan_rows.tolist()
        if any(invalid):
            logits = logits.masked_fill(nan_rows.unsqueeze(1), 0.0)
        params = [r.params for r in requests]
        want_logprobs = [p.logprobs for p in params]
        raw_logprobs = None
        if any(k is not None for k in want_logprobs):
            raw_logprobs = torch.log_softmax(logits, dim=-1)

        logits = self._apply_penalties(logits, requests)
        logits = self._apply_min_tokens(logits, requests)
        if grammar is not None:
            grammar.apply(logits)

        greedy = [p.greedy for p in params]
        if all(greedy):
            tokens = logits.argmax(dim=-1)
        else:
            tokens = self._sample(logits, requests, greedy)
        token_list = tokens.tolist()
        lp_out: list[dict[int, Logprob] | None] = [None] * num_rows
        if raw_logprobs is not None:
            lp_out = self._gather_logprobs(raw_logprobs, token_list, want_logprobs)
        return SamplerOutput(token_list, lp_out, invalid)

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
                seen = torch.tensor(sorted(t for t in set(requests[i].all_token_ids) if t < vocab),
                                    dtype=torch.long, device=logits.device)
                vals = row[seen]
                row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            if (p.presence_penalty or p.frequency_penalty) and requests[i].output_token_ids:
                # As OpenAI: over generated tokens only.
                # Built where the logits are (a GPU's): a host tensor here failed on CUDA.
                out = torch.tensor(requests[i].output_token_ids, dtype=torch.long,
                                   device=logits.device)
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
                logits[i, sorted(banned)] = float("-inf")
        return logits

    def _sample(self, logits: torch.Tensor, requests: list[SamplingRow], greedy: list[bool]) -> torch.Tensor:
        params = [r.params for r in requests]
        device = logits.device
        temps = torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)],
                             device=device, dtype=torch.float32)
        scaled = logits / temps.unsqueeze(1)
        need_sort = any(p.top_k > 0 or p.top_p < 1.0 for p in params)
        if need_sort:
            scaled = self._top_k_top_p(scaled, params)
        if any(p.min_p > 0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], device=device).unsqueeze(1)
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
        cdf = probs.cumsum(dim=-1)
        total = cdf[:, -1:]
        # Strictly inside the mass: u * total can round up to total when u is near 1.
        target = torch.minimum(uniforms.to(device).unsqueeze(1) * total,
                               torch.nextafter(total, torch.zeros_like(total)))
        # right=True: the first token whose cumulative mass exceeds the target, so tokens of
        # zero probability (masked by top-k/top-p/min-p) are never chosen.
        sampled = torch.searchsorted(cdf, target, right=True).squeeze(1)
        # A row with no finite distribution (a temperature so small that logits / T
        # overflowed) has no CDF to search: it takes its most likely token.
        mass = total.squeeze(1)
        broken = ~torch.isfinite(mass) | (mass <= 0)
        if bool(broken.any()):
            sampled = torch.where(broken, logits.argmax(dim=-1), sampled)
        sampled = sampled.clamp_(max=logits.shape[1] - 1)
        greedy_t = torch.tensor(greedy, device=device)
        if greedy_t.any():
            sampled = torch.where(greedy_t, logits.argmax(dim=-1), sampled)
        return sampled

    @staticmethod
    def _top_k_top_p(scaled: torch.Tensor, params) -> torch.Tensor:
        vocab = scaled.shape[1]
        device = scaled.device
        top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float32)
        sorted_logits, sorted_idx = scaled.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=device).unsqueeze(0)
        remove = ranks >= top_k.unsqueeze(1)
        probs = sorted_logits.softmax(-1)
        # Keep the smallest set whose mass reaches top_p (the first token always stays).
        mass_before = probs.cumsum(-1) - probs
        remove |= mass_before >= top_p.unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        return torch.empty_like(scaled).scatter_(1, sorted_idx, sorted_logits)

    @staticmethod
    def _gather_logprobs(raw: torch.Tensor, tokens: list[int], want: list[int | None]):
        out: list[dict[int, Logprob] | None] = []
        max_k = max(k or 0 for k in want)
        top_vals = top_idx = None
        if max_k:
            top_vals, top_idx = raw.topk(max_k, dim=-1)
        tok_t = torch.tensor(tokens, device=raw.device).unsqueeze(1)
        chosen = raw.gather(1, tok_t).squeeze(1)
        ranks = (raw > chosen.unsqueeze(1)).sum(-1) + 1
        chosen_l, ranks_l = chosen.tolist(), ranks.tolist()
        tv = top_vals.tolist() if top_vals is not None else None
        ti = top_idx.tolist() if top_idx is not None else None
        for i, k in enumerate(want):
            if k is None:
                out.append(None)
                continue
            entry = {tokens[i]: Logprob(chosen_l[i], ranks_l[i])}
            for j in range(k):
                tid = ti[i][j]  # type: ignore[index]
                if tid not in entry:
                    entry[tid] = Logprob(tv[i][j], j + 1)  # type: ignore[index]
            out.append(entry)
        return out
