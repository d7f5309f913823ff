"""Scheduling policies: whose prompt gets the step's budget, whose request gives its blocks
back, and which key waits over its share of the pool (docs/design.md §2, "Scheduling").

The Scheduler (engine/core/scheduler.py) owns the mechanism: the token budget, the sequence
cap, block allocation, preemption by recompute. A policy owns the choices, through the small
interface below, so schedule() has no branch per policy:

  prefill_order(prefills, waiting)  the order in which running prompts and waiting requests
                                    share what the step's budget has left after the decodes
  held_back(request)                its key is over its KV share cap: it gets a prefill
                                    chunk only if no other key got one in this step
  prefill_pace(key, waiters, base)  how the pacer sizes a prompt chunk of `key` in a step
                                    on which `waiters[k]` requests of each key k wait for
                                    their next token (its decodes, and the prompts it
                                    finishes): (the waiters to size it for, the slowdown
                                    allowed), or None for the whole budget
  victim(running)                   the running request to preempt when blocks run out, and
                                    why (the WARNING says it)
  admission_victim(request, blocks, the running request to preempt so that a waiting request,
                   running)         needing `blocks` in all, can be admitted (None: it waits)
  add / remove / charge             a request entered or left; the tokens this step gave each

The engine knows keys, never users: a key is an opaque string (the server passes the user's
id), `priority` a positive weight, `max_kv_share` a fraction of the pool.

- `fcfs`: vLLM's default. Running prompts first, then arrival order; preempt the most
  recently admitted request. Keys and weights are ignored.
- `priority`: vLLM's flag. Running prompts first, then waiting requests by priority (highest
  weight first; arrival order among equals); preempt the lowest priority, most recently
  admitted. (vLLM's priority is an integer where lower runs first; ours is the weight the
  fair policy also reads, so higher runs first.)
- `fair`: weighted least recent service. Each key's service is the tokens scheduled for it
  (prompt chunks and decodes), decayed with a half-life of `half_life_tokens` scheduled
  tokens of all keys, divided by its weight. Prompt work goes to keys in ascending order of
  that number, FCFS within a key (its running prompts first). The victim is the most recently
  admitted request of the key holding the most blocks for its weight, so a key under its
  share is not preempted while another holds more than its own, except that the oldest
  running request, once preempted, is not taken again while another runs (so every request
  finishes). A key holding more than
  `max_kv_share` of the pool gets no new prompt chunks in a step where another key's prompt
  work was scheduled. A waiting request that does not fit, of a key that would stay within
  its fair share of the pool (by weight, among the keys with requests), may preempt the
  newest running request of the key holding the most blocks per weight, if that key is over
  its own share and would still hold more per weight than the waiting key once admitted (so
  two keys never take blocks back and forth): a giant thread cannot keep everyone else
  waiting for the cache. While another key decodes that has had less than half this key's
  service per weight, the prompt chunks of the most served key may slow the step by a
  quarter of what the pacer allows (`GUEST_SLOWDOWN_SHARE`): the heavy user's documents are
  prefilled in smaller bites while a light user is reading the answer word by word. And while
  nothing decodes but such lighter keys were served recently (service at least
  `PRESENT_SHARE` of this key's), its chunks are paced as if each of them had a decode
  running, rather than taking the whole budget: a light user between two turns would
  otherwise find, on sending the next, a whole-budget step of the heavy user's to wait out.
  The other way round, a lighter key's prompt is paced only for the decodes of keys within
  their fair share of the pool: the decodes of a key over it wait on the step.
  A lone key gets exactly the fcfs schedule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from officellm.engine.core.kv_cache_manager import KVCacheManager
from officellm.engine.core.request import Request

SCHEDULING_POLICIES = ("fcfs", "priority", "fair")
# The policies under which the prefix cache evicts from the key with the largest footprint
# (blocks held plus free) first (engine/core/block_pool.py), not simply the least recently
# freed block.
EVICTS_BY_OWNER = frozenset({"fair"})
# The share of the pacer's allowed slowdown a heavier key's prompt gets while a lighter key
# decodes (fair): at the office profile's 2x, such a step costs at most 1.25 decode steps.
GUEST_SLOWDOWN_SHARE = 0.25
# A key counts as recently present for pacing while its decayed service is at least this
# share of the paced key's (so a user who left stops counting after a few half-lives).
PRESENT_SHARE = 0.01


class SchedulingPolicy(Protocol):
    """What the Scheduler asks of a policy (the module docstring says when)."""

    name: str

    def add(self, request: Request) -> None: ...

    def remove(self, request: Request) -> None: ...

    def prefill_order(self, prefills: list[Request], waiting: Iterable[Request]) -> list[Request]: ...

    def held_back(self, request: Request) -> bool: ...

    def prefill_pace(self, key: str, waiters: Mapping[str, int],
                     base: float) -> tuple[int, float] | None: ...

    def victim(self, running: Sequence[Request]) -> tuple[Request, str]: ...

    def admission_victim(self, request: Request, num_blocks: int,
                         running: Sequence[Request]) -> tuple[Request, str] | None: ...

    def charge(self, scheduled: Mapping[Request, int]) -> None: ...


class FcfsPolicy:
    """First come, first served (vLLM's `fcfs`): arrival order, the newest is preempted."""

    name = "fcfs"

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv

    def add(self, request: Request) -> None:
        pass

    def remove(self, request: Request) -> None:
        pass

    def prefill_order(self, prefills: list[Request], waiting: Iterable[Request]) -> list[Request]:
        # Running prompts before new ones: a prompt half done already holds its blocks.
        return [*prefills, *waiting]

    def held_back(self, request: Request) -> bool:
        return False

    def prefill_pace(self, key: str, waiters: Mapping[str, int],
                     base: float) -> tuple[int, float] | None:
        # While others wait on the step, pace it. Alone: the whole budget.
        num_waiters = sum(waiters.values())
        return (num_waiters, base) if num_waiters else None

    def victim(self, running: Sequence[Request]) -> tuple[Request, str]:
        return running[-1], "it is the most recently admitted request"

    def admission_victim(self, request: Request, num_blocks: int,
                         running: Sequence[Request]) -> tuple[Request, str] | None:
        return None  # arrival order: a waiting request waits for blocks to free

    def charge(self, scheduled: Mapping[Request, int]) -> None:
        pass


class PriorityPolicy(FcfsPolicy):
    """vLLM's `priority`, with a weight (higher first) for the priority."""

    name = "priority"

    def prefill_order(self, prefills: list[Request], waiting: Iterable[Request]) -> list[Request]:
        # sorted() is stable: among equal priorities the queue's order (a preempted request
        # at its head, then arrival) stays.
        return [*prefills, *sorted(waiting, key=lambda r: -r.priority)]

    def victim(self, running: Sequence[Request]) -> tuple[Request, str]:
        # min() keeps the first of equals; over reversed(), that is the newest.
        victim = min(reversed(running), key=lambda r: r.priority)
        return victim, (f"it is the most recently admitted of the lowest priority "
                        f"({victim.priority:g})")


@dataclass
class KeyState:
    """What the fair policy knows of one key."""

    weight: float = 1.0
    max_kv_share: float | None = None
    service: float = 0.0  # decayed scheduled tokens, as of `clock`
    clock: float = 0.0  # the policy's token clock when `service` was last brought up to date
    num_requests: int = 0  # in the scheduler (waiting or running)


class FairPolicy:
    """Weighted least recent service across keys, FCFS within a key."""

    name = "fair"

    def __init__(self, kv: KVCacheManager, half_life_tokens: float) -> None:
        if half_life_tokens <= 0:
            raise ValueError("half_life_tokens must be positive.")
        self.kv = kv
        self.half_life_tokens = half_life_tokens
        self.keys: dict[str, KeyState] = {}
        # Tokens scheduled so far, all keys together: the clock service decays by. Counted in
        # tokens, not seconds, so the same work gives the same schedule on any machine (and
        # in tests), and an idle engine forgets nothing.
        self.clock = 0.0

    # -- the keys ------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        state = self.keys.get(request.fairness_key)
        if state is None:
            state = self.keys[request.fairness_key] = KeyState(clock=self.clock)
        # The key's latest request sets its weight and cap: the server reads the policy per
        # request, so an admin's change applies from the next request on.
        state.weight = request.priority
        state.max_kv_share = request.max_kv_share
        state.num_requests += 1

    def remove(self, request: Request) -> None:
        state = self.keys.get(request.fairness_key)
        if state is None:
            return
        state.num_requests -= 1
        if state.num_requests <= 0 and self.service(request.fairness_key) < 1.0:
            del self.keys[request.fairness_key]  # idle and forgotten: nothing to remember

    def service(self, key: str) -> float:
        """The key's decayed service (tokens), now."""
        state = self.keys.get(key)
        if state is None:
            return 0.0
        return state.service * 0.5 ** ((self.clock - state.clock) / self.half_life_tokens)

    def normalized_service(self, key: str) -> float:
        """Service per unit of weight: the order prompt work goes in (lowest first)."""
        state = self.keys.get(key)
        return self.service(key) / state.weight if state is not None else 0.0

    def weight(self, key: str) -> float:
        state = self.keys.get(key)
        return state.weight if state is not None else 1.0

    # -- the choices ---------------------------------------------------------------------
    def prefill_order(self, prefills: list[Request], waiting: Iterable[Request]) -> list[Request]:
        groups: dict[str, list[Request]] = {}
        for req in prefills:
            groups.setdefault(req.fairness_key, []).append(req)
        for req in waiting:
            groups.setdefault(req.fairness_key, []).append(req)
        if len(groups) <= 1:  # a lone key: the fcfs order, at no cost
            return [req for group in groups.values() for req in group]
        # Keys over their cap last (they get what the others leave, if nothing else ran);
        # then least service per weight first. sorted() is stable: ties keep the order of
        # first appearance (running prompts, then the queue's order).
        order = sorted(groups, key=lambda k: (self._over_cap(k), self.normalized_service(k)))
        return [req for key in order for req in groups[key]]

    def held_back(self, request: Request) -> bool:
        return self._over_cap(request.fairness_key)

    def prefill_pace(self, key: str, waiters: Mapping[str, int],
                     base: float) -> tuple[int, float] | None:
        mine = self.normalized_service(key)
        # Only the most served key is a guest: light users' prompts among each other keep the
        # pacer's full allowance (a light prompt is short, and its user is waiting for it).
        if self.keys and mine >= max(self.normalized_service(k) for k in self.keys):
            lighter = {k for k in self.keys
                       if k != key and 2.0 * self.normalized_service(k) < mine}
            num_waiters = sum(waiters.values())
            if num_waiters:
                if any(waiters.get(k) for k in lighter):
                    return num_waiters, 1.0 + (base - 1.0) * GUEST_SLOWDOWN_SHARE
                return num_waiters, base
            floor = PRESENT_SHARE * self.service(key)
            present = [k for k in lighter if self.service(k) >= floor]
            return (len(present), base) if present else None
        # A lighter key's prompt is paced only for the decodes of keys within their fair share
        # of the pool: those of a key over it (a heavy user's documents) wait on the step, or a
        # light user's next turn would be cut into bites for that key's sake and wait several
        # steps for its first word. A newcomer's first document, holding nothing yet, is
        # still paced for everyone decoding.
        paced = sum(n for k, n in waiters.items() if k == key or not self._over_fair_share(k))
        return (paced, base) if paced else None

    def fair_share(self, key: str) -> float:
        """The blocks `key` may hold by its weight, among the keys with requests (the whole
        pool when none has any)."""
        total = sum(s.weight for s in self.keys.values() if s.num_requests > 0)
        pool = self.kv.pool.num_blocks
        return pool * self.weight(key) / total if total else pool

    def _over_fair_share(self, key: str) -> bool:
        return self.kv.blocks_by_key.get(key, 0) > self.fair_share(key)

    def _over_cap(self, key: str) -> bool:
        state = self.keys.get(key)
        if state is None or state.max_kv_share is None:
            return False
        return self.kv.blocks_by_key.get(key, 0) > state.max_kv_share * self.kv.pool.num_blocks

    def victim(self, running: Sequence[Request]) -> tuple[Request, str]:
        # Newest first, keeping the first strictly heaviest: that is the most recently
        # admitted request of the key with the most blocks per weight (on a tie, the key
        # whose newest request is newest, so a lone key loses its newest, as under fcfs).
        # The oldest running request, once it has been preempted before, is not chosen
        # while another runs: it then always moves on, so every request in turn becomes the
        # oldest and finishes, however large (a request bigger than its key's share would
        # otherwise be preempted forever). A fresh one can still be taken, so a heavy key's
        # lone request does not push a light key's out.
        held = self.kv.blocks_by_key
        protect = len(running) > 1 and running[0].num_preemptions > 0
        candidates = running[1:] if protect else running
        victim, heaviest = candidates[-1], -1.0
        for req in reversed(candidates):
            load = held.get(req.fairness_key, 0) / self.weight(req.fairness_key)
            if load > heaviest:
                victim, heaviest = req, load
        key = victim.fairness_key
        blocks = held.get(key, 0)
        share = blocks / self.kv.pool.num_blocks if self.kv.pool.num_blocks else 0.0
        return victim, (f"its key holds the most KV blocks for its weight ({blocks} blocks, "
                        f"{100 * share:.0f}% of the pool, weight {self.weight(key):g}), "
                        "and it is that key's most recently admitted request")

    def admission_victim(self, request: Request, num_blocks: int,
                         running: Sequence[Request]) -> tuple[Request, str] | None:
        held = self.kv.blocks_by_key
        key = request.fairness_key
        # Only within fair shares of the pool (by weight, among keys with requests): a key
        # that would go over its own share waits, and only a key over its share gives up a
        # request. Without this, always-busy keys would take blocks from one another forever.
        share = self.fair_share
        if held.get(key, 0) + num_blocks > share(key):
            return None
        mine = (held.get(key, 0) + num_blocks) / self.weight(key)
        # As in victim(): newest first, the first strictly heaviest, and the oldest running
        # request protected once it has been preempted (so it always finishes).
        protect = len(running) > 1 and running[0].num_preemptions > 0
        victim, heaviest = None, mine
        for req in reversed(running[1:] if protect else running):
            if req.fairness_key == key:
                continue
            blocks = held.get(req.fairness_key, 0)
            load = blocks / self.weight(req.fairness_key)
            if load > heaviest and blocks > share(req.fairness_key):
                victim, heaviest = req, load
        if victim is None:
            return None
        other = victim.fairness_key
        return victim, (f"key {key!r} waits to be admitted and {other!r} holds more KV blocks "
                        f"for its weight ({held.get(other, 0)} blocks, weight "
                        f"{self.weight(other):g}); it is that key's most recently admitted "
                        "request")

    def charge(self, scheduled: Mapping[Request, int]) -> None:
        step: dict[str, int] = {}
        for req, tokens in scheduled.items():
            step[req.fairness_key] = step.get(req.fairness_key, 0) + tokens
        for key, tokens in step.items():
            state = self.keys.get(key)
            if state is None:  # cannot happen for a request the scheduler holds
                continue
            state.service = self.service(key) + tokens
            state.clock = self.clock
        self.clock += sum(step.values())


def make_policy(name: str, kv: KVCacheManager, max_num_batched_tokens: int) -> SchedulingPolicy:
    """The policy called `name` (one of SCHEDULING_POLICIES)."""
    if name == "fcfs":
        return FcfsPolicy(kv)
    if name == "priority":
        return PriorityPolicy(kv)
    if name == "fair":
        # "Recently": about sixteen full steps' worth of tokens, so a key's past weighs on
        # its turn for seconds, not for the rest of the day.
        return FairPolicy(kv, half_life_tokens=16 * max_num_batched_tokens)
    raise ValueError(f"Unknown scheduling policy {name!r}; choose one of "
                     f"{', '.join(SCHEDULING_POLICIES)}.")
