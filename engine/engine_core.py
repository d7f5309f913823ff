"""EngineCore: the step loop over token ids (schedule -> execute -> update), and its stats."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from officellm.engine.config import KV_DISK_AUTO, EngineConfig, format_gib
from officellm.engine.core.kv_cache_manager import KVCacheManager
from officellm.engine.core.lower_tier import BlockSave
from officellm.engine.core.prefill_pacer import PrefillPacer
from officellm.engine.core.request import EngineCoreRequest, Request, RequestStatus
from officellm.engine.core.scheduler import Scheduler
from officellm.engine.core.scheduler_output import EngineCoreOutput, SchedulerOutput
from officellm.engine.core.scheduling_policy import EVICTS_BY_OWNER
from officellm.engine.core.speculation import Speculation
from officellm.engine.cpu_caches import bound_cpu_kernel_caches
from officellm.engine.distributed.parallel_state import ParallelState
from officellm.engine.host_memory import release_freed_memory, resident_memory_bytes
from officellm.engine.kv_offload.disk_tier import DiskTier
from officellm.engine.kv_offload.host_tier import HostTier, host_tier_bytes
from officellm.engine.kv_offload.kv_identity import kv_identity
from officellm.engine.kv_offload.kv_tiers import KVTiers
from officellm.engine.kv_plan import kv_block_bytes
from officellm.engine.loading.model_loader import load_config_dict, model_display_name
from officellm.engine.loading.model_spec import ModelSpec
from officellm.engine.models.shard_plan import ShardPlan
from officellm.engine.precision.kv_cache_dtype import kv_dtype_name, scale_bytes
from officellm.engine.precision.measured_choice import machine_key
from officellm.engine.stats import EngineStats
from officellm.engine.structured_output.bitmask import grammar_bitmask
from officellm.engine.structured_output.request_grammar import RequestGrammar
from officellm.engine.worker.executor import (
    Executor,
    LaunchedStep,
    StepResult,
    UniprocExecutor,
)
from officellm.engine.worker.model_runner import BlocksOnHost, ModelRunner
from officellm.engine.worker.multiproc_executor import MultiprocExecutor, WorkerDiedError
from officellm.engine.worker.worker import Worker, check_devices

logger = logging.getLogger("engine")


@dataclass(frozen=True)
class LaunchedForward:
    """A step whose forward is queued: what was scheduled, when it was launched, and the
    blocks it fills for the lower tier, copied out after it."""

    so: SchedulerOutput
    step: LaunchedStep
    started: float
    saved: BlocksOnHost | None = None


@dataclass(frozen=True)
class InFlightStep:
    """A sampled step: what was scheduled, its samples once read, when it was launched."""

    so: SchedulerOutput
    result: StepResult
    started: float
    saved: BlocksOnHost | None = None


def uses_async_scheduling(config: EngineConfig) -> bool:
    """config.async_scheduling, or by default: on for one CUDA device without speculation.
    A CPU runs the forward on the scheduling thread itself, so nothing would overlap."""
    if config.async_scheduling is not None:
        return config.async_scheduling
    return (config.device.startswith("cuda") and config.tensor_parallel_size == 1
            and config.speculative_config is None)


class EngineCore:
    """Loads the model on its ranks, sizes the KV pool, and runs steps.

    Knows nothing of text, HTTP, users or SQL: requests arrive as token ids
    (EngineCoreRequest) and leave as sampled tokens (EngineCoreOutput); `cache_salt`,
    `fairness_key`, `priority` and `max_kv_share` are opaque tags. Not thread-safe: one thread owns it.
    """

    def __init__(self, config: EngineConfig, model_dir: Path,
                 eos_token_ids: frozenset[int]) -> None:
        # Before this process's first matmul, and before the tensor-parallel workers start
        # (they inherit the environment): oneDNN reads the capacities when it first caches.
        bound_cpu_kernel_caches()
        self.config = config
        self.eos_token_ids = eos_token_ids
        spec = ModelSpec.from_config_dict(load_config_dict(model_dir))
        # Refuse an impossible split before any worker process starts.
        ShardPlan.for_rank(spec, 0, config.tensor_parallel_size)
        check_devices(config.device, config.tensor_parallel_size)
        # Ranks 1..tp-1 run in worker processes, in step with this one (rank 0).
        workers = (MultiprocExecutor(config, model_dir)
                   if config.tensor_parallel_size > 1 else None)
        try:
            worker = Worker(config, model_dir, workers.parallel if workers else ParallelState())
            logger.info("Loaded %s (%s, %s, weights %s, KV cache %s) in %.1f s: %s of "
                        "weights%s", model_display_name(model_dir), worker.spec.model_type,
                        str(worker.dtype).removeprefix("torch."),
                        worker.weight_format,
                        kv_dtype_name(worker.kv_dtype), worker.load_seconds,
                        format_gib(worker.weight_bytes),
                        f" on rank 0 of {config.tensor_parallel_size} (tensor parallel)"
                        if workers else "")
            num_blocks, self.max_model_len = worker.size_pool()
            runner = worker.init_cache(num_blocks, self.max_model_len)
            # Loading's copies (a GGUF's raw blocks, before fusing and packing) are freed
            # in pieces small enough for glibc to keep in its heap: 2.6 GiB at 8B.
            release_freed_memory()
            rss = resident_memory_bytes()
            if rss is not None:
                # The pool is zero-filled, so resident from the start; what is left over the
                # weights and the pool is the runtime (torch, tokenizer, loading's leftovers).
                pool = sum(c.numel() * c.element_size()
                           for c in (*runner.k_caches, *runner.v_caches))
                logger.info("Resident memory after load: %s (this process: %s of weights, %s "
                            "of KV pool)", format_gib(rss), format_gib(worker.weight_bytes),
                            format_gib(pool))
        except BaseException:
            if workers is not None:
                workers.close()
            raise
        if workers is not None:
            workers.started(runner)
        self.executor: Executor = workers if workers is not None else UniprocExecutor(runner)
        self.runner = runner  # rank 0's: for introspection (tests, benchmarks), not for steps
        self.spec, self.dtype, self.device = worker.spec, worker.dtype, worker.device
        self.kv_dtype = worker.kv_dtype
        # The model takes images: its vision tower is loaded (engine/models/vision/).
        self.vision: bool = runner.encoder_cache is not None
        self.weight_format = worker.weight_format  # dense, in blocks, or both (in words)
        self.weight_bytes = worker.weight_bytes
        self.backend, self.model = worker.backend, worker.model
        # A block's bytes per token it holds: pool bytes = blocks x block_size x this (every
        # layer's KV for a model of one attention type).
        self.bytes_per_token = kv_block_bytes(
            self.spec, runner.groups, self.kv_dtype.itemsize, scale_bytes(self.kv_dtype), 1,
            config.tensor_parallel_size)
        self.kv_tiers = self._open_tiers(config, model_dir, worker, runner, num_blocks,
                                         self.executor)
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching,
                                 config.scheduling_policy in EVICTS_BY_OWNER, runner.groups,
                                 self.kv_tiers)
        pacer = PrefillPacer(config.prefill_pacing) if config.prefill_pacing else None
        speculation = (Speculation(config.speculative_config, self.max_model_len)
                       if config.speculative_config is not None else None)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens,
                                   self.max_model_len, pacer, config.scheduling_policy,
                                   speculation, self.spec.long_context_after)
        self.async_scheduling = uses_async_scheduling(config)
        if self.async_scheduling:
            logger.info("Async scheduling: each step is scheduled and launched while the "
                        "device runs the one before (--no-async-scheduling turns it off)")
        # Async scheduling: the step launched last, whose samples are not read yet.
        self._in_flight: InFlightStep | None = None
        self.num_steps_total = 0
        self._log_state = (time.monotonic(), 0, 0)

    @classmethod
    def _open_tiers(cls, config: EngineConfig, model_dir: Path, worker: Worker,
                    runner: ModelRunner, num_blocks: int,
                    executor: Executor) -> KVTiers | None:
        """The KV cache's tiers below the pool that the config asks for (None: neither)."""
        host_bytes = host_tier_bytes(config)
        host = None
        if host_bytes:
            pinned = worker.device.type == "cuda"
            host = HostTier(host_bytes, runner.block_bytes, pinned)
            logger.info("KV host tier: %s of %sRAM, %d blocks", format_gib(host.capacity_bytes),
                        "pinned " if pinned else "", host.num_slots)
        disk = (cls._open_disk_tier(config, model_dir, worker, runner, num_blocks, executor)
                if config.kv_disk_dir is not None else None)
        if host is None and disk is None:
            return None
        return KVTiers(host, disk, executor.write_blocks)

    @staticmethod
    def _open_disk_tier(config: EngineConfig, model_dir: Path, worker: Worker,
                        runner: ModelRunner, num_blocks: int, executor: Executor) -> DiskTier:
        """The KV disk tier, under this model's identity as loaded here."""
        import officellm

        code = Path(officellm.__file__).parent
        loaded_as = [*machine_key(), str(worker.dtype), kv_dtype_name(worker.kv_dtype),
                     str(config.block_size), repr(runner.groups), str(worker.weight_format),
                     type(runner.attention).__name__, str(config.batch_invariant),
                     _source_digest(code / "engine", code / "kernels")]
        if config.kv_disk_dir == KV_DISK_AUTO:
            raise ValueError(f"kv_disk_dir {KV_DISK_AUTO!r} is officellm serve's (its data "
                             "directory); give a directory")
        if config.kv_disk_key is None or len(config.kv_disk_key) < 16:
            raise ValueError("the KV disk tier seals every block: give kv_disk_key, a secret "
                             "of at least 16 bytes that you keep (officellm serve derives its "
                             "own from the install key)")
        tier = DiskTier(Path(config.kv_disk_dir or ""), kv_identity(model_dir, loaded_as),
                        config.kv_disk_key, int(config.kv_disk_size), runner.block_bytes,
                        float(config.kv_disk_ttl), runner.block_bytes * num_blocks,
                        # From its reader threads: on CUDA each copy is waited for there.
                        lambda ids, payloads: executor.write_blocks(ids, payloads, wait=True))
        logger.info("KV disk tier: %s, up to %s, blocks unused for %.0f h removed",
                    tier.model_dir, format_gib(tier.capacity_bytes),
                    float(config.kv_disk_ttl) / 3600)
        return tier

    def close(self) -> None:
        """Write what the disk tier has queued and stop the tensor-parallel worker
        processes, if any (idempotent)."""
        if self.kv_tiers is not None:
            self.kv_tiers.close()
        self.executor.close()

    def purge_cache_salt(self, cache_salt: str | None) -> int:
        """Forget every cached block computed under this prefix-cache salt, in the pool and
        in the tiers below it (the disk's: every model's folder there); the pool's blocks
        dropped."""
        dropped = self.kv.uncache_salt(cache_salt)
        if self.kv_tiers is not None:
            self.kv_tiers.purge(cache_salt)
        return dropped

    # -- requests ------------------------------------------------------------------------
    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue one sequence (already validated by the front end)."""
        grammar = None if request.grammar is None else RequestGrammar(request.grammar)
        self.scheduler.add_request(Request.from_core_request(request, self.eos_token_ids, grammar))

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Stop these requests now and free their blocks (unknown ids are ignored)."""
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        """Requests queued or running, or a launched step still to read."""
        return self.scheduler.has_unfinished_requests() or self._in_flight is not None

    # -- stepping ------------------------------------------------------------------------
    def step(self) -> list[EngineCoreOutput]:
        """Schedule, run the model, update the requests; one output per request that
        sampled (or failed).

        The step's forward is queued before the previous step's samples are read and applied,
        and its sampling after: the sampler's penalties, min_tokens and grammar masks then
        count the previous step's tokens. With async scheduling (engine/config.py) the
        step's samples are left in flight until the next step: the host schedules and
        launches step N+1 while the device still runs step N, and N+1's decodes read the
        tokens N sampled on the device. A request that ends in N has a wasted row in N+1,
        and outputs come a step's host work later; the device never waits for the host.

        A failure while running a batch fails the requests of that batch alone; the
        engine and every other request go on. The exception is a tensor-parallel worker
        that died (WorkerDiedError): the batch's requests are failed, then the error is
        raised, since no further step can run.
        """
        outputs: list[EngineCoreOutput] = []
        previous, self._in_flight = self._in_flight, None
        so = self.scheduler.schedule()
        launched = None
        if not so.is_empty:
            self.num_steps_total += 1
            launched = self._launch(so, outputs)
        elif self.kv_tiers is not None and previous is None and self.kv_tiers.reading():
            self.kv_tiers.wait_for_reads(0.05)  # nothing to run until a prefix is read
        if previous is not None:
            outputs += self._finish_step(previous)
        if launched is not None:
            current = self._sample(launched, outputs)
            if current is not None and self.async_scheduling:
                self._in_flight = current
            elif current is not None:
                outputs += self._finish_step(current)
        self._scrub()
        self._maybe_log_stats()
        return outputs

    def _launch(self, so: SchedulerOutput,
                outputs: list[EngineCoreOutput]) -> LaunchedForward | None:
        """Queue a scheduled step's forward; None if it failed (its requests' outputs go to
        `outputs`)."""
        started = time.perf_counter()
        try:
            step = self.executor.launch(so)
            # Queued after the forward that fills them; kept once the step is known good.
            saved = (self.executor.read_blocks([save.block_id for save in so.kv_saves])
                     if so.kv_saves else None)
            return LaunchedForward(so, step, started, saved)
        except Exception as exc:  # noqa: BLE001 - isolate the failure to this batch
            outputs += self._fail(so, exc)
            return None

    def _sample(self, launched: LaunchedForward,
                outputs: list[EngineCoreOutput]) -> InFlightStep | None:
        """Queue a launched step's sampling, with its requests' grammar masks as they stand
        now; None if it failed (its requests' outputs go to `outputs`)."""
        so = launched.so
        try:
            grammar = grammar_bitmask(so.sampling_requests, self.spec.vocab_size)
            return InFlightStep(so, launched.step.sample(grammar), launched.started,
                                launched.saved)
        except Exception as exc:  # noqa: BLE001 - isolate the failure to this batch
            outputs += self._fail(so, exc)
            return None

    def _finish_step(self, step: InFlightStep) -> list[EngineCoreOutput]:
        """Read a sampled step's samples and update its requests from them."""
        try:
            sampled = step.result.result()
        except Exception as exc:  # noqa: BLE001 - a failure surfaced at the read
            return self._fail(step.so, exc)
        outputs = self.scheduler.update_from_output(step.so, sampled,
                                                    time.perf_counter() - step.started)
        if step.saved is not None:
            self._save_blocks(step.so.kv_saves, step.saved)
        return outputs

    def _save_blocks(self, saves: tuple[BlockSave, ...], saved: BlocksOnHost) -> None:
        """Hand the tiers below the pool the blocks a step filled that still hold what it
        computed: a request that failed in the step (NaN, an error) has had its blocks
        uncached."""
        assert self.kv_tiers is not None
        blocks = self.kv.pool.blocks
        for save, payload in zip(saves, saved.payloads(), strict=True):
            if blocks[save.block_id].block_hash == save.key:
                self.kv_tiers.put(save.key, save.cache_salt, payload)

    def _fail(self, so: SchedulerOutput, exc: Exception) -> list[EngineCoreOutput]:
        logger.error("Engine step failed; failing the %d requests of this batch",
                     len(so.chunks), exc_info=exc)
        outputs = self.scheduler.fail_batch(so, f"internal error while running the model: {exc}")
        if isinstance(exc, WorkerDiedError):
            raise exc  # no step can run any more: the engine's owner must restart it
        return outputs

    def _scrub(self) -> None:
        """Zero the blocks failed requests left (they may hold NaN that a later reader's
        masked tail would turn into NaN output)."""
        blocks, self.scheduler.blocks_to_scrub = self.scheduler.blocks_to_scrub, []
        if blocks:
            self.executor.scrub(blocks)

    # -- observability -------------------------------------------------------------------
    def stats(self) -> EngineStats:
        pool, sched = self.kv.pool, self.scheduler
        spec = sched.speculation
        running_by_key: dict[str, int] = {}
        for req in sched.running:
            running_by_key[req.fairness_key] = running_by_key.get(req.fairness_key, 0) + 1
        return EngineStats(
            num_blocks_total=pool.num_blocks,
            num_blocks_used=pool.num_used_blocks,
            num_blocks_cached=pool.num_cached_blocks,
            kv_cache_usage=pool.usage(),
            num_running=len(sched.running),
            num_waiting=len(sched.waiting),
            num_preemptions_total=sched.num_preemptions_total,
            prefix_cache_queries=self.kv.prefix_cache_queries,
            prefix_cache_hits=self.kv.prefix_cache_hits,
            prompt_tokens_total=sched.prompt_tokens_total,
            generation_tokens_total=sched.generation_tokens_total,
            block_size=self.kv.block_size,
            kv_cache_tokens=self.kv.groups.max_tokens_in(pool.num_blocks, self.kv.block_size),
            kv_cache_groups=self.kv.groups,
            bytes_per_token=self.bytes_per_token,
            kv_cache_dtype=kv_dtype_name(self.kv_dtype),
            weight_bytes=self.weight_bytes,
            max_model_len=self.max_model_len,
            num_requests_finished_total=sched.num_finished_total,
            num_steps_total=self.num_steps_total,
            scheduling_policy=sched.policy.name,
            spec_decode_num_drafts=spec.num_drafts_total if spec is not None else 0,
            spec_decode_num_draft_tokens=spec.num_draft_tokens_total if spec is not None else 0,
            spec_decode_num_accepted_tokens=(spec.num_accepted_tokens_total
                                             if spec is not None else 0),
            kv_blocks_by_key=dict(self.kv.blocks_by_key),
            preemptions_by_key=dict(sched.preemptions_by_key),
            running_by_key=running_by_key,
            prompt_tokens_computed_total=sched.prompt_tokens_computed_total,
            kv_tier_queries=self.kv.lower_tier_queries,
            kv_tier_hits=self.kv.lower_tier_hits,
            kv_host=(self.kv_tiers.host.stats()
                     if self.kv_tiers is not None and self.kv_tiers.host is not None else None),
            kv_disk=(self.kv_tiers.disk.stats()
                     if self.kv_tiers is not None and self.kv_tiers.disk is not None else None),
        )

    def _maybe_log_stats(self) -> None:
        now = time.monotonic()
        last, p0, g0 = self._log_state
        interval = self.config.stats_log_interval
        if interval <= 0 or now - last < interval:
            return
        dt = now - last
        s = self.stats()
        hit = 100.0 * s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0
        logger.info(
            "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
            "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
            (s.prompt_tokens_total - p0) / dt, (s.generation_tokens_total - g0) / dt,
            s.num_running, s.num_waiting, 100.0 * s.kv_cache_usage, hit)
        self._log_state = (now, s.prompt_tokens_total, s.generation_tokens_total)


def _source_digest(*folders: Path) -> str:
    """A digest of the code that computes KV (engine/ and kernels/ sources): a block from
    another build of it is not read as this one's."""
    h = hashlib.blake2b(digest_size=16)
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.suffix in {".py", ".cpp", ".h"}:
                h.update(path.relative_to(folder.parent).as_posix().encode() + b"\0")
                h.update(path.read_bytes())
    return h.hexdigest()
