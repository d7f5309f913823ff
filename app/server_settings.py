"""The server's settings: one typed place, filled by `officellm serve` or by tests."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from engine import EngineConfig

# A thread counts as active (/admin/stats, officellm:active_threads) while its user is
# plausibly still reading or typing.
ACTIVE_THREAD_MINUTES = 15


@dataclass
class ServerSettings:
    """Everything `create_app` and the engine need. Engine fields follow vLLM's flag names."""

    # Engine
    model: str | None = None  # HF directory or .gguf; None = the bundled SmolLM2
    device: str = "cpu"
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    enable_prefix_caching: bool = True
    kv_cache_memory: int | str | None = None
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    prefill_pacing: float | None = None  # see EngineConfig; 0 from the flag = off
    tensor_parallel_size: int = 1
    # CPU threads for the engine; None = $OMP_NUM_THREADS if set (as vLLM and PyTorch honour
    # it), else the engine's default of every core.
    num_threads: int | None = None
    # Server
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: list[str] = field(default_factory=list)  # empty = the engine's name
    # Static keys (`--api-key`), accepted beside the database's per-user keys; key i (from 1)
    # is the user "key<i>", created in the database on first use of the flag.
    api_keys: list[str] = field(default_factory=list)
    no_auth: bool = False  # single-user desk mode: every request is the local user
    db_path: str | None = None  # None = officellm.db in the user's data directory
    admin_remote: bool = False  # let non-loopback clients reach /admin (token still needed)
    stats_window_s: float = 60.0  # what /admin/stats' rates and latency percentiles cover
    shutdown_timeout: float = 30.0
    profile: str = "office"
    # Longest prompt (a chat's length so far) accepted; None = only max_model_len limits it.
    max_context_tokens: int | None = None
    retry_after_s: int = 5  # what 503 answers tell clients to wait
    max_request_bytes: int = 10 * 1024 * 1024  # bodies over this get 413 (0: no limit)
    # Requests queued beyond the max_num_seqs running; more get 429 + Retry-After at once
    # (app/overload.py) rather than an unbounded wait.
    max_waiting_requests: int = 128
    # Refused tokens per client address per minute before that address gets 429 (0: off).
    auth_failure_limit: int = 10
    cors_origins: list[str] = field(default_factory=list)  # empty: no CORS headers at all

    def engine_config(self) -> EngineConfig:
        """The EngineConfig these settings describe."""
        return EngineConfig(
            model=self.model, device=self.device, dtype=self.dtype,
            max_model_len=self.max_model_len, block_size=self.block_size,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            enable_prefix_caching=self.enable_prefix_caching,
            kv_cache_memory=self.kv_cache_memory,
            gpu_memory_utilization=self.gpu_memory_utilization, seed=self.seed,
            prefill_pacing=self.prefill_pacing or None,
            tensor_parallel_size=self.tensor_parallel_size,
            num_threads=self.num_threads or _omp_num_threads(),
        )


def _omp_num_threads() -> int | None:
    # The engine calls torch.set_num_threads(all cores) unless told otherwise, which would
    # silently override an operator's OMP_NUM_THREADS.
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None
