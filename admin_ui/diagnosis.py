"""docs/design.md §9's symptom table made live: pure rules over a short history of stats snapshots.

Each rule looks at what an office admin can act on and answers in the admin's words: the
symptom users see, the likely cause, and what to change. Rules never raise on thin data; they
stay silent until there is enough history to say something true.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from officellm.admin_ui.snapshot import StatsSnapshot, UserShare

# Thresholds in one place so the tests and the docs can name them.
WINDOW_S = 60.0  # how far back a rule looks
KV_HIGH = 0.90  # KV usage above which preemption is near
ITL_SPIKE_RATIO = 3.0  # p99 inter-token latency this many times the median is a spike
ITL_SPIKE_MIN_S = 0.15  # ... and at least this long, so a fast idle server is not flagged
LONG_PREFILL_TOKENS = 512  # prompt tokens taken in between two snapshots that mark a long prefill
SLOW_FIRST_WORD_S = 2.0  # median time to first token users notice
STEADY_ITL_RATIO = 2.0  # p99/p50 ITL under this is "steady"
# A user holding at least this share of the pool while preemptions happen is named as the one
# behind them (below it the cache is full of many people's ordinary chats).
HEAVY_SHARE = 0.25

OK, INFO, WARNING = "ok", "info", "warning"


@dataclass
class Finding:
    """One row of the live symptom table."""

    rule: str
    severity: str  # ok | info | warning
    symptom: str  # what users see
    cause: str  # the likely cause, in plain words
    advice: str  # what the admin can do
    evidence: list[str] = field(default_factory=list)  # the numbers behind it


def _window(history: Sequence[StatsSnapshot], seconds: float = WINDOW_S) -> list[StatsSnapshot]:
    if not history:
        return []
    now = history[-1].received
    return [s for s in history if now - s.received <= seconds]


def kv_cache_full(history: Sequence[StatsSnapshot]) -> Finding | None:
    """Preemptions rising: the KV cache is full and long chats are paused and recomputed."""
    w = _window(history)
    if len(w) < 2:
        return None
    rise = w[-1].engine.num_preemptions_total - w[0].engine.num_preemptions_total
    if rise <= 0:
        return None
    peak = max(s.engine.kv_cache_usage for s in w)
    cause = "the KV cache is full: long conversations are being paused and recomputed"
    advice = ("lower per-user max context (Policies) or ask users to start new chats; "
              "more KV memory (--kv-cache-memory / --gpu-memory-utilization) also helps")
    evidence = [f"{rise} preemption(s) in the last {w[-1].received - w[0].received:.0f} s",
                f"KV cache usage peaked at {peak:.0%}"]
    heavy = heaviest_holder(w[-1])
    if heavy is not None:
        # Name who is behind the storm: the admin's lever is that user's policy.
        held = f"{heavy.user} holds {heavy.kv_share:.0%} of the KV cache in " \
               f"{heavy.running} running request{'s' if heavy.running != 1 else ''}"
        cause = f"the KV cache is full and {held}"
        advice = (f"give {heavy.user} a KV share cap or a lower priority (Policies; it "
                  "applies from their next request), or a lower max context; " + advice)
        evidence.insert(0, held)
        preempted = _preempted_users(w)
        if preempted:
            evidence.append("preempted: " + ", ".join(f"{u} {n}" for u, n in preempted))
    return Finding(
        rule="kv_cache_full", severity=WARNING,
        symptom="answers stop mid-sentence, then resume",
        cause=cause, advice=advice, evidence=evidence,
    )


def heaviest_holder(snap: StatsSnapshot) -> UserShare | None:
    """The user holding the largest share of the KV cache, if it is a large one."""
    if not snap.users:
        return None
    top = max(snap.users, key=lambda u: u.kv_blocks)
    return top if top.kv_share >= HEAVY_SHARE else None


def _preempted_users(w: Sequence[StatsSnapshot]) -> list[tuple[str, int]]:
    """Preemptions per user within the window, most first."""
    before = {u.user: u.preemptions_total for u in w[0].users}
    rises = [(u.user, u.preemptions_total - before.get(u.user, 0)) for u in w[-1].users]
    return sorted(((u, n) for u, n in rises if n > 0), key=lambda p: -p[1])


def kv_cache_near_full(history: Sequence[StatsSnapshot]) -> Finding | None:
    """KV usage high but no preemption yet: the early warning before the stalls start."""
    if not history or kv_cache_full(history) is not None:
        return None
    usage = history[-1].engine.kv_cache_usage
    if usage < KV_HIGH:
        return None
    return Finding(
        rule="kv_cache_near_full", severity=INFO,
        symptom="nothing yet; the next long turn may stall someone",
        cause=f"the KV cache is {usage:.0%} full",
        advice="watch the heaviest threads (Threads tab); a per-user context cap keeps one "
               "long chat from crowding out the others",
        evidence=[f"KV cache usage {usage:.0%}"],
    )


def prefill_stall(history: Sequence[StatsSnapshot]) -> Finding | None:
    """ITL spikes while a long prompt is prefilled: one big paste fills the step."""
    w = _window(history)
    if len(w) < 2:
        return None
    lat = w[-1].latency
    if lat.itl_p50 is None or lat.itl_p99 is None or lat.itl_p50 <= 0:
        return None
    spiking = lat.itl_p99 >= ITL_SPIKE_RATIO * lat.itl_p50 and lat.itl_p99 >= ITL_SPIKE_MIN_S
    if not spiking:
        return None
    biggest = max(b.engine.prompt_tokens_total - a.engine.prompt_tokens_total
                  for a, b in zip(w, w[1:]))
    if biggest < LONG_PREFILL_TOKENS:
        return None
    return Finding(
        rule="prefill_stall", severity=WARNING,
        symptom="everyone's answer freezes at once when someone pastes a big document",
        cause="one long prompt is being prefilled and fills the step",
        advice="keep chunked prefill on and lower the token budget "
               "(--max-num-batched-tokens, e.g. 512-2048) so decodes keep flowing",
        evidence=[f"ITL p99 {lat.itl_p99 * 1000:.0f} ms vs p50 {lat.itl_p50 * 1000:.0f} ms",
                  f"{biggest:,} prompt tokens taken in within one second"],
    )


def slow_first_word(history: Sequence[StatsSnapshot]) -> Finding | None:
    """Slow first word, fluent typing after: prefill is not getting enough of the step."""
    if not history:
        return None
    lat = history[-1].latency
    if lat.ttft_p50 is None or lat.ttft_p50 < SLOW_FIRST_WORD_S:
        return None
    if lat.itl_p50 is not None and lat.itl_p99 is not None and lat.itl_p50 > 0 \
            and lat.itl_p99 >= ITL_SPIKE_RATIO * lat.itl_p50:
        return None  # typing is not fluent either; prefill_stall or load is the story
    return Finding(
        rule="slow_first_word", severity=INFO,
        symptom="slow first word, fluent typing after",
        cause="prompts are not getting enough of each step",
        advice="a larger token budget (--max-num-batched-tokens) brings the first word sooner, "
               "at some cost to the others' typing speed",
        evidence=[f"TTFT p50 {lat.ttft_p50:.1f} s"],
    )


def steady_batching(history: Sequence[StatsSnapshot]) -> Finding | None:
    """Everyone a bit slower but steady: batching is doing its job."""
    w = _window(history)
    if len(w) < 2:
        return None
    if w[-1].engine.num_preemptions_total != w[0].engine.num_preemptions_total:
        return None
    if max(s.engine.num_running for s in w) < 2:
        return None
    lat = w[-1].latency
    if lat.itl_p50 is None or lat.itl_p99 is None or lat.itl_p50 <= 0:
        return None
    if lat.itl_p99 >= STEADY_ITL_RATIO * lat.itl_p50:
        return None
    peak = max(s.engine.num_running for s in w)
    return Finding(
        rule="steady_batching", severity=OK,
        symptom="everyone a bit slower but steady",
        cause="batching is doing its job: several requests share each step",
        advice="nothing to do; if typing feels slow for everyone, the machine is at its "
               "throughput and a faster GPU or a smaller model is the lever",
        evidence=[f"up to {peak} requests running together",
                  f"ITL p50 {lat.itl_p50 * 1000:.0f} ms, p99 {lat.itl_p99 * 1000:.0f} ms"],
    )


RULES: list[Callable[[Sequence[StatsSnapshot]], Finding | None]] = [
    kv_cache_full, prefill_stall, kv_cache_near_full, slow_first_word, steady_batching,
]


def diagnose(history: Sequence[StatsSnapshot]) -> list[Finding]:
    """Every rule's finding, warnings first; an "all quiet" row when none has anything to say."""
    findings = [f for rule in RULES if (f := rule(history)) is not None]
    order = {WARNING: 0, INFO: 1, OK: 2}
    findings.sort(key=lambda f: order.get(f.severity, 3))
    if not findings and history:
        latest = history[-1]
        findings.append(Finding(
            rule="quiet", severity=OK, symptom="nothing unusual",
            cause="no preemptions, no latency spikes",
            advice="nothing to do",
            evidence=[f"KV cache usage {latest.engine.kv_cache_usage:.0%}, "
                      f"{latest.engine.num_running} running, {latest.engine.num_waiting} waiting"],
        ))
    return findings
