"""Serving profiles (docs/design.md §9): starting points for the engine's knobs that flags override."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from officellm.app.server_settings import ServerSettings


@dataclass(frozen=True)
class Profile:
    """Defaults one kind of deployment wants; each value has the reason it was chosen."""

    name: str
    description: str
    values: dict[str, Any]
    reasons: dict[str, str]


# Why the office and personal profiles keep the prefix cache on disk too.
KV_DISK_REASON = ("the prefix cache on disk too (kv-cache/ in the data directory, sealed, per "
                  "person, 20 GiB, 7 days): a coding agent's instructions (~9-21k tokens, "
                  "minutes of prefill on a CPU) are read back after a restart, an idle sleep "
                  "or a model swap instead of computed again")

# Why every profile keeps a host tier under a GPU's pool.
KV_HOST_REASON = ("on a GPU, a quarter of the free RAM (up to 16 GiB, pinned) keeps the "
                  "blocks that leave the GPU's pool: an evicted prefix or a preempted chat is "
                  "copied back instead of computed; none on a CPU, whose pool is that RAM")

PROFILES: dict[str, Profile] = {
    "personal": Profile(
        "personal", "one user; batching hardly matters",
        {"max_num_batched_tokens": 8192, "max_num_seqs": 16, "max_context_tokens": None,
         "prefill_pacing": None, "scheduling_policy": "fcfs", "kv_disk_dir": "auto",
         "kv_offloading_size": "auto"},
        {"max_num_batched_tokens": "a large token budget brings the first word sooner",
         "scheduling_policy": "fcfs: one person, nothing to share",
         "prefill_pacing": "off: with one person typing nobody else waits on a prompt",
         "max_num_seqs": "one person rarely runs more than a few requests",
         "max_context_tokens": "no context cap: long context is affordable for one user",
         "kv_disk_dir": KV_DISK_REASON, "kv_offloading_size": KV_HOST_REASON},
    ),
    "office": Profile(
        "office", "5-30 people; steady typing speed matters more than the first word",
        {"max_num_batched_tokens": 1024, "max_num_seqs": 64, "max_context_tokens": 16384,
         "prefill_pacing": 2.0, "scheduling_policy": "fair", "kv_disk_dir": "auto",
         "kv_offloading_size": "auto"},
        {"max_num_batched_tokens": "chunked prefill with a small budget, so a pasted document "
                                   "does not freeze everyone's typing",
         "scheduling_policy": "fair: prompt work goes to the user served least recently, and "
                              "the one holding most of the KV cache gives it back first",
         "prefill_pacing": "while others type, a prompt's chunk costs at most one more decode "
                           "step (measured: a CPU needs far smaller chunks than a GPU)",
         "max_num_seqs": "room for a busy office",
         "max_context_tokens": "per-user context cap: longer chats are asked to start anew "
                               "(watch vllm:num_preemptions_total as the early warning)",
         "kv_disk_dir": KV_DISK_REASON, "kv_offloading_size": KV_HOST_REASON},
    ),
    "product": Profile(
        "product", "customer-facing; tail latency targets",
        {"max_num_batched_tokens": 512, "max_num_seqs": 128, "max_context_tokens": 8192,
         "gpu_memory_utilization": 0.8, "prefill_pacing": 1.5, "scheduling_policy": "fair",
         "kv_disk_dir": "off", "kv_offloading_size": "auto"},
        {"max_num_batched_tokens": "a small budget keeps inter-token latency's tail short",
         "scheduling_policy": "fair: one customer's burst does not queue the others",
         "prefill_pacing": "tail latency first: a prompt's chunk costs half a decode step",
         "max_num_seqs": "many short customer requests",
         "max_context_tokens": "hard context cap: no request beyond it is admitted",
         "gpu_memory_utilization": "memory headroom kept free for spikes",
         "kv_disk_dir": "off: customers' conversations are not kept on disk, even sealed",
         "kv_offloading_size": KV_HOST_REASON},
    ),
}


def apply_profile(settings: ServerSettings, name: str, explicit: set[str]) -> list[str]:
    """Set the profile's values on `settings` (its engine's knobs and the server's own), except
    fields in `explicit` (given as flags).

    Returns one human-readable line per setting, for the start-up log.
    """
    if name not in PROFILES:
        raise ValueError(f"Unknown profile {name!r}; choose one of {', '.join(PROFILES)}.")
    profile = PROFILES[name]
    settings.profile = name
    engine_fields = {f.name for f in fields(settings.engine)}
    server_fields = {f.name for f in fields(settings)}
    lines = [f"Profile {name!r} ({profile.description})"]
    for key, value in profile.values.items():
        on_engine = key in engine_fields
        assert on_engine or key in server_fields, key
        if key in explicit:
            current = getattr(settings.engine if on_engine else settings, key)
            lines.append(f"  {key}={current!r} (flag overrides the profile's {value!r})")
            continue
        if on_engine:
            settings.engine = replace(settings.engine, **{key: value})
        else:
            setattr(settings, key, value)
        lines.append(f"  {key}={value!r}: {profile.reasons[key]}")
    return lines
