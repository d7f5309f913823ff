"""One step's samples on their way from the device to the host.

The sampler leaves its results on the device: the tokens, the NaN rows and, when asked for,
the logprobs and prompt logprobs, packed into one integer and one float tensor. On CUDA
those are copied into pinned host memory without waiting, and an event marks the end of the
step's sampling, so the host can queue the next step's forward before it reads this one's
tokens, and the read waits for this step's kernels alone, not for the forward queued behind
them (the engine's async scheduling: engine/engine_core.py). Elsewhere the copy is made when
the result is read.
"""

from __future__ import annotations

import torch

from officellm.engine.core.logprob import Logprob
from officellm.engine.core.scheduler_output import SamplerOutput
from officellm.engine.worker.sampling_metadata import PromptLogprobRows

# Per row, on the device: the scored token's logprob and rank, the top-k logprobs and ids.
RowLogprobs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
# Per row, on the device: SamplingParams.logprob_token_ids' logprobs, ranks and ids.
NamedLogprobs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _entry(token: int, chosen: float, rank: int, top_ids: list[int], top_vals: list[float],
           want: int) -> dict[int, Logprob]:
    """One token's logprobs entry: the token itself, then the `want` most likely tokens."""
    entry = {token: Logprob(chosen, rank)}
    for j in range(want):
        if top_ids[j] not in entry:
            entry[top_ids[j]] = Logprob(top_vals[j], j + 1)
    return entry


class PendingSamples:
    """The sampled rows of one step, readable once the device has produced them.

    `tokens` stays on the device: the next step's forward reads a decode's input token from
    it without a round trip through the host.
    """

    def __init__(self, tokens: torch.Tensor, invalid: torch.Tensor,
                 logprobs: RowLogprobs | None, want_logprobs: list[int | None],
                 prompt_logprobs: RowLogprobs | None = None,
                 prompt_rows: list[PromptLogprobRows] | None = None,
                 named: NamedLogprobs | None = None,
                 named_ids: list[list[int]] | None = None) -> None:
        self.tokens = tokens
        self.num_rows = tokens.shape[0]
        self._want = want_logprobs
        self._prompt_rows = prompt_rows or []
        # ints: tokens, NaN flags, then (with logprobs) each chosen token's rank and the
        # top-k ids, then (with named tokens) their ranks, then (with prompt logprobs) theirs;
        # floats: the chosen tokens' logprobs and the top-k logprobs, the named tokens',
        # then the prompt rows'.
        parts = [tokens, invalid.to(torch.int64)]
        float_parts: list[torch.Tensor] = []
        self._has_logprobs = logprobs is not None
        self._max_k = self._pack(logprobs, parts, float_parts)
        self._named_ids = named_ids if named is not None else None
        self._named_width = 0
        if named is not None:
            vals, ranks, _ = named
            parts.append(ranks.to(torch.int64).reshape(-1))
            float_parts.append(vals.float().reshape(-1))
            self._named_width = vals.shape[1]
        self._prompt_k = self._pack(prompt_logprobs, parts, float_parts)
        ints = torch.cat(parts)
        floats = torch.cat(float_parts) if float_parts else None
        self._event: torch.cuda.Event | None = None
        if ints.device.type == "cuda":
            self._ints = torch.empty(ints.shape, dtype=ints.dtype, pin_memory=True)
            self._ints.copy_(ints, non_blocking=True)
            self._floats = None
            if floats is not None:
                self._floats = torch.empty(floats.shape, dtype=floats.dtype, pin_memory=True)
                self._floats.copy_(floats, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._ints, self._floats = ints, floats
        self._result: SamplerOutput | None = None

    @staticmethod
    def _pack(found: RowLogprobs | None, ints: list[torch.Tensor],
              floats: list[torch.Tensor]) -> int:
        """Append rows' logprobs to the parts read back; their top-k width (0: none)."""
        if found is None:
            return 0
        chosen, ranks, top_vals, top_idx = found
        ints += [ranks.to(torch.int64), top_idx.reshape(-1)]
        floats += [chosen.float(), top_vals.float().reshape(-1)]
        return top_idx.shape[1]

    def result(self) -> SamplerOutput:
        """The samples on the host (waits for this step's sampling on the device, once)."""
        if self._result is not None:
            return self._result
        if self._event is not None:
            self._event.synchronize()
        n, k = self.num_rows, self._max_k
        ints = self._ints.to("cpu").tolist()
        floats = self._floats.to("cpu").tolist() if self._floats is not None else []
        tokens, invalid = ints[:n], [bool(x) for x in ints[n:2 * n]]
        i, f = 2 * n, 0  # where the next part starts in ints and in floats
        lp_out: list[dict[int, Logprob] | None] = [None] * n
        if self._has_logprobs:
            ranks, top_idx = ints[i:i + n], ints[i + n:i + n + n * k]
            chosen, top_vals = floats[:n], floats[n:n + n * k]
            i, f = i + n + n * k, n + n * k
            for row, want in enumerate(self._want):
                if want is not None:
                    lp_out[row] = _entry(tokens[row], chosen[row], ranks[row],
                                         top_idx[row * k:(row + 1) * k],
                                         top_vals[row * k:(row + 1) * k], want)
        if self._named_ids is not None:
            w = self._named_width
            ranks, vals = ints[i:i + n * w], floats[f:f + n * w]
            i, f = i + n * w, f + n * w
            for row, ids in enumerate(self._named_ids):
                entry = lp_out[row]
                for j, token in enumerate(ids):
                    if entry is not None and token not in entry:
                        entry[token] = Logprob(vals[row * w + j], ranks[row * w + j])
        prompt_out: list[list[dict[int, Logprob]]] = []
        if self._prompt_rows:
            m, pk = sum(len(p.next_token_ids) for p in self._prompt_rows), self._prompt_k
            ranks, top_idx = ints[i:i + m], ints[i + m:i + m + m * pk]
            chosen, top_vals = floats[f:f + m], floats[f + m:f + m + m * pk]
            row = 0
            for rows in self._prompt_rows:
                entries = []
                for token in rows.next_token_ids:
                    entries.append(_entry(token, chosen[row], ranks[row],
                                          top_idx[row * pk:(row + 1) * pk],
                                          top_vals[row * pk:(row + 1) * pk], rows.num_top))
                    row += 1
                prompt_out.append(entries)
        self._result = SamplerOutput(tokens, lp_out, invalid, prompt_out)
        return self._result
