"""The engine's live numbers: what the server, metrics and console read."""

from __future__ import annotations

from dataclasses import dataclass, field

from officellm.engine.core.kv_cache_groups import KVCacheGroups


@dataclass(frozen=True)
class DiskTierStats:
    """What the disk tier holds and has done since the engine started."""

    files: int
    bytes_used: int
    capacity_bytes: int
    blocks_written: int
    blocks_read: int
    blocks_unreadable: int  # damaged, foreign or vanished files (each a miss)
    writes_dropped: int  # blocks not saved: the write queue was full
    writable: bool
    # Bytes per owner: a prefix-cache salt's folder name (kv_disk_owner names a salt's).
    bytes_by_owner: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class HostTierStats:
    """What the host tier holds and has done since the engine started."""

    blocks: int
    bytes_used: int
    capacity_bytes: int
    blocks_stored: int
    blocks_read: int
    blocks_evicted: int  # the least recently used, to make room
    pinned: bool


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine.

    `kv_cache_usage` counts blocks held by live requests; cached blocks that no request holds
    are free (evictable), so an idle engine reads 0. Prefix-cache queries and hits count tokens.
    Token totals count each sequence (a request with n = 2 counts its prompt twice), as vLLM's
    counters do. The `*_by_key` maps are per fairness key (an opaque tag; the server maps its
    keys to user names): blocks in the block tables of the key's requests, its preemptions
    since start, its running requests. Keys with nothing to count are absent.
    """

    num_blocks_total: int
    num_blocks_used: int
    num_blocks_cached: int
    kv_cache_usage: float
    num_running: int
    num_waiting: int
    num_preemptions_total: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens_total: int
    generation_tokens_total: int
    block_size: int = 16
    # The longest request the pool holds (every block, for a model of one attention type).
    kv_cache_tokens: int = 0
    # A block's bytes per token slot: the pool is num_blocks_total x block_size x this.
    bytes_per_token: int = 0
    kv_cache_dtype: str = ""  # the KV cache's storage dtype, e.g. "float16"
    # The weights' bytes as this rank holds them (GGUF blocks, dense, or both).
    weight_bytes: int = 0
    max_model_len: int = 0
    num_requests_finished_total: int = 0
    num_steps_total: int = 0
    scheduling_policy: str = "fcfs"
    # Speculation (--speculative-config): verification steps with drafts, the drafts, and
    # those the model kept (vLLM's spec_decode counters).
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    kv_blocks_by_key: dict[str, int] = field(default_factory=dict)
    preemptions_by_key: dict[str, int] = field(default_factory=dict)
    running_by_key: dict[str, int] = field(default_factory=dict)
    # Prompt work run through the model: prompts' tokens past their prefix hits, and what
    # preemption made them compute again (drafts' and decodes' tokens are not in it).
    prompt_tokens_computed_total: int = 0
    # Prompt tokens looked up at admission with a tier below the pool, and those whose KV was
    # copied back from one (host or disk) instead of computed (vLLM's external prefix cache;
    # not in prefix_cache_hits); each tier's own numbers (None: that tier is off).
    kv_tier_queries: int = 0
    kv_tier_hits: int = 0
    kv_host: HostTierStats | None = None
    kv_disk: DiskTierStats | None = None
    # The layers' KV cache groups: what a request of n tokens holds (sliding windows).
    kv_cache_groups: KVCacheGroups = field(default_factory=lambda: KVCacheGroups.for_windows(
        [None]))

    @property
    def kv_cache_bytes(self) -> int:
        """The KV pool's bytes."""
        return self.num_blocks_total * self.block_size * self.bytes_per_token

    def requests_that_fit(self, num_tokens: int) -> float:
        """How many requests of `num_tokens` tokens the pool holds at once."""
        held = self.kv_cache_groups.blocks_held(num_tokens, self.block_size)
        return self.num_blocks_total / held if held else 0.0
