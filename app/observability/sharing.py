"""Who holds the machine: the engine's per-key numbers under user names.

The engine counts KV blocks, running requests and preemptions per fairness key, an opaque
string (docs/design.md §2); the server's keys are user ids (app/policy/scheduling.py). This
module is the one place that turns them into per-user rows, for /admin/stats, /metrics and the
preemption events; the names come from the database, looked up by the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from officellm.app.policy.scheduling import by_user_name, user_id_of_key
from officellm.engine import EngineStats

# user ids -> names (a database read; the caller decides on which thread)
NameLookup = Callable[[Iterable[int]], Mapping[int, str]]


@dataclass(frozen=True)
class UserShare:
    """One user's hold on the engine right now, and their preemptions since start."""

    user: str
    kv_blocks: int  # blocks in the block tables of their requests
    kv_share: float  # of the whole pool
    running: int  # their requests in the running batch
    preemptions_total: int
    kv_disk_bytes: int = 0  # their blocks in the KV disk tier (docs/kv_tiers.md)


def user_ids(stats: EngineStats) -> set[int]:
    """The users behind the keys the snapshot mentions."""
    keys = (*stats.kv_blocks_by_key, *stats.preemptions_by_key, *stats.running_by_key)
    return {uid for uid in map(user_id_of_key, keys) if uid is not None}


def user_shares(stats: EngineStats, names: Mapping[int, str],
                disk_owner: Callable[[int], str] | None = None) -> list[UserShare]:
    """Every user holding blocks, running or ever preempted, the heaviest holder first;
    with `disk_owner` (a user id's folder in the KV disk tier), their bytes there too."""
    blocks = by_user_name(stats.kv_blocks_by_key, names)
    running = by_user_name(stats.running_by_key, names)
    preempted = by_user_name(stats.preemptions_by_key, names)
    on_disk: dict[str, int] = {}
    if disk_owner is not None and stats.kv_disk is not None:
        by_owner = stats.kv_disk.bytes_by_owner
        on_disk = {name: by_owner.get(disk_owner(uid), 0) for uid, name in names.items()}
    total = stats.num_blocks_total
    rows = [UserShare(user, blocks.get(user, 0),
                      round(blocks.get(user, 0) / total, 4) if total else 0.0,
                      running.get(user, 0), preempted.get(user, 0), on_disk.get(user, 0))
            for user in {*blocks, *running, *preempted}]
    return sorted(rows, key=lambda r: (-r.kv_blocks, -r.running, r.user))


def preemptions_since(before: EngineStats | None, now: EngineStats,
                      names: Mapping[int, str]) -> dict[str, int]:
    """Preemptions per user between two snapshots (users with none are absent)."""
    old = by_user_name(before.preemptions_by_key, names) if before is not None else {}
    new = by_user_name(now.preemptions_by_key, names)
    return {user: n - old.get(user, 0) for user, n in new.items() if n > old.get(user, 0)}
