"""One step's samples on their way from the device to the host.

The sampler leaves its results on the device: the tokens, the NaN rows and, when asked for,
the logprobs, packed into one integer and one float tensor. On CUDA those are copied into
pinned host memory without waiting, and an event marks the end of the step's sampling, so
the host can queue the next step's forward before it reads this one's tokens, and the read
waits for this step's kernels alone, not for the forward queued behind them (the engine's
async scheduling: engine/engine_core.py). Elsewhere the copy is made when the result is read.
"""

from __future__ import annotations

import torch

from officellm.engine.core.scheduler_output import Logprob, SamplerOutput


class PendingSamples:
    """The sampled rows of one step, readable once the device has produced them.

    `tokens` stays on the device: the next step's forward reads a decode's input token from
    it without a round trip through the host.
    """

    def __init__(self, tokens: torch.Tensor, invalid: torch.Tensor,
                 logprobs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
                 want_logprobs: list[int | None]) -> None:
        self.tokens = tokens
        self.num_rows = tokens.shape[0]
        self._want = want_logprobs
        # ints: tokens, NaN flags, then (with logprobs) each chosen token's rank and the
        # top-k ids; floats: the chosen tokens' logprobs, then the top-k logprobs.
        parts = [tokens, invalid.to(torch.int64)]
        floats = None
        self._max_k = 0
        if logprobs is not None:
            chosen, ranks, top_vals, top_idx = logprobs
            self._max_k = top_idx.shape[1]
            parts += [ranks.to(torch.int64), top_idx.reshape(-1)]
            floats = torch.cat((chosen.float(), top_vals.float().reshape(-1)))
        ints = torch.cat(parts)
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

    def result(self) -> SamplerOutput:
        """The samples on the host (waits for this step's sampling on the device, once)."""
        if self._result is not None:
            return self._result
        if self._event is not None:
            self._event.synchronize()
        n, k = self.num_rows, self._max_k
        ints = self._ints.to("cpu").tolist()
        tokens, invalid = ints[:n], [bool(x) for x in ints[n:2 * n]]
        lp_out: list[dict[int, Logprob] | None] = [None] * n
        if self._floats is not None:
            ranks, top_idx = ints[2 * n:3 * n], ints[3 * n:]
            floats = self._floats.to("cpu").tolist()
            chosen, top_vals = floats[:n], floats[n:]
            for i, want in enumerate(self._want):
                if want is None:
                    continue
                entry = {tokens[i]: Logprob(chosen[i], ranks[i])}
                for j in range(want):
                    tid = top_idx[i * k + j]
                    if tid not in entry:
                        entry[tid] = Logprob(top_vals[i * k + j], j + 1)
                lp_out[i] = entry
        self._result = SamplerOutput(tokens, lp_out, invalid)
        return self._result
