"""Speculative decoding's policy in the core: which running sequences draft, how many
tokens, what their verification keeps, and when a sequence stops drafting.

A decode with drafts runs its last known token and its k drafts in one chunk; every position
samples. Verification keeps the drafts up to the first one the model did not choose, plus the
model's own token there. Greedy, that is what k + 1 single steps would have chosen (up to the
kernels' rounding: the chunk runs another attention path than a decode); sampled, each
position draws by rejection sampling against its draft (engine/worker/sampler.py), so every
kept token has exactly the distribution a single step would give it. Sequences with a grammar
do not draft; penalties and min_tokens see each position's drafts as output
(engine/worker/sampling_metadata.py), so they keep working.

Drafting costs rows: k more tokens through the matmuls and attention. Each sequence keeps
the share of its recent drafts the model accepted; with the prefill pacer's measured step
costs it drafts only while the tokens it expects to gain per second of step time it adds
beat the step's own tokens per second (and, unmeasured, while at least MIN_ACCEPTANCE of
its drafts are accepted). A sequence whose drafts stop paying pauses drafting, for longer
each time.
"""

from __future__ import annotations

from officellm.engine.core.ngram_proposer import NgramProposer
from officellm.engine.core.prefill_pacer import PrefillPacer
from officellm.engine.core.request import Request
from officellm.engine.core.speculative_config import SpeculativeConfig

MIN_ACCEPTANCE = 0.1  # without measured costs: draft while at least this share is kept
SMOOTHING = 0.5  # the weight of the latest step's acceptance in the running share
FIRST_PAUSE, MAX_PAUSE = 4, 256  # steps without drafting after drafts stopped paying
RESUME_ACCEPTANCE = 0.5  # the share a sequence resumes with after a pause


class Speculation:
    """Drafts for the scheduler's running decodes, and their verification's bookkeeping."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.config = config
        self.proposer = NgramProposer(config)
        self.max_model_len = max_model_len
        self.num_draft_tokens_total = 0
        self.num_accepted_tokens_total = 0
        self.num_drafts_total = 0  # verification steps with at least one draft

    @staticmethod
    def drafts_for(req: Request) -> bool:
        """Whether `req` may draft: without a grammar (its bitmask would have to follow
        each draft). A sampled sequence's drafts are verified by rejection sampling."""
        return req.grammar is None

    def propose(self, req: Request) -> None:
        """Set the drafts `req` verifies in its next step ([] for none)."""
        req.draft_token_ids = []
        if not self.drafts_for(req):
            return
        if req.draft_pause:
            req.draft_pause -= 1
            return
        p = req.params
        # The step emits up to k + 1 tokens: the drafts and the model's token after them.
        room = self.max_model_len - len(req.all_token_ids) - 1
        if p.max_tokens is not None:
            room = min(room, p.max_tokens - req.num_output_tokens - 1)
        req.draft_token_ids = self.proposer.propose(req.all_token_ids, room)

    def worth_it(self, req: Request, pacer: PrefillPacer | None, num_decodes: int,
                 decode_context: float) -> bool:
        """Whether `req`'s drafts are expected to pay for their rows in this step: with the
        pacer's costs, the tokens they add per second of step time they add against the
        step's tokens per second; else its acceptance against MIN_ACCEPTANCE."""
        k = len(req.draft_token_ids)
        a = min(req.draft_acceptance, 0.999)
        costs = pacer.costs() if pacer is not None else None
        if costs is None:
            return a >= MIN_ACCEPTANCE
        fixed, per_row, per_pair, per_chunk_context = costs
        context = req.num_computed_tokens
        row = per_row + per_pair * context
        step = fixed + max(num_decodes, 1) * (per_row + per_pair * decode_context)
        added = k * row + per_chunk_context * context
        gained = a * (1 - a ** k) / (1 - a)  # expected accepted drafts
        return gained * step > added * max(num_decodes, 1)

    def verified(self, req: Request, drafted: int, accepted: int) -> None:
        """Record a verification of `drafted` drafts of which `accepted` were kept."""
        self.num_drafts_total += 1
        self.num_draft_tokens_total += drafted
        self.num_accepted_tokens_total += accepted
        req.draft_acceptance = ((1 - SMOOTHING) * req.draft_acceptance
                                + SMOOTHING * accepted / drafted)
        if req.draft_acceptance < MIN_ACCEPTANCE:
            req.draft_pause = min(MAX_PAUSE, FIRST_PAUSE << req.draft_pauses)
            req.draft_pauses += 1
            req.draft_acceptance = RESUME_ACCEPTANCE
