"""LLMEngine: add requests, step (schedule -> run -> update -> outputs), stats."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig, format_gib
from engine.detokenizer import IncrementalDetokenizer
from engine.executor import MultiprocExecutor, WorkerDiedError
from engine.kv_cache_manager import KVCacheManager
from engine.model_loader import eos_token_ids, load_config_dict, resolve_model_dir
from engine.model_spec import ModelSpec
from engine.models.shard_plan import ShardPlan
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from engine.parallel_state import ParallelState
from engine.prefill_pacer import PrefillPacer
from engine.request import Request, RequestStatus
from engine.sampler import SamplerOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.stats import EngineStats
from engine.worker import Worker, check_devices

logger = logging.getLogger("engine")

class PromptTooLongError(ValueError):
    """The prompt (plus at least one generated token) exceeds max_model_len."""


@dataclass
class _Sequence:
    """Engine-side state of one output sequence: detokenizer and what was reported."""

    request: Request
    detok: IncrementalDetokenizer
    reported_tokens: int = 0
    reported_logprobs: int = 0


@dataclass
class _Group:
    """A user's request: n sequences reported under one id."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[_Sequence] = field(default_factory=list)


def _group_metrics(requests: list[Request]) -> RequestMetrics:
    """One user request's timing over its n sequences: first token of any, end of the last."""
    if len(requests) == 1:
        return requests[0].metrics
    ms = [r.metrics for r in requests]

    def first(vals):
        vals = [v for v in vals if v is not None]
        return min(vals) if vals else None

    done = [m.finished_time for m in ms]
    return RequestMetrics(
        arrival_time=min(m.arrival_time for m in ms),
        first_scheduled_time=first(m.first_scheduled_time for m in ms),
        first_token_time=first(m.first_token_time for m in ms),
        last_token_time=max((m.last_token_time for m in ms if m.last_token_time), default=None),
        finished_time=max(done) if all(d is not None for d in done) else None,  # type: ignore[type-var]
    )


class LLMEngine:
    """The paged inference engine. Knows nothing of HTTP, users or SQL: `user`, `thread` and
    `cache_salt` are opaque tags."""

    def __init__(self, config: EngineConfig | None = None, **kwargs: Any) -> None:
        config = config or EngineConfig(**kwargs)
        self.config = config
        self.model_dir = resolve_model_dir(config.model)
        spec = ModelSpec.from_config_dict(load_config_dict(self.model_dir))
        # Refuse an impossible split before any worker process starts.
        ShardPlan.for_rank(spec, 0, config.tensor_parallel_size)
        check_devices(config.device, config.tensor_parallel_size)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.eos_token_ids = frozenset(eos_token_ids(self.model_dir, self.tokenizer))
        # Ranks 1..tp-1 run in worker processes, in step with this one (rank 0).
        self.executor = (MultiprocExecutor(config, self.model_dir)
                         if config.tensor_parallel_size > 1 else None)
        try:
            worker = Worker(config, self.model_dir,
                            self.executor.parallel if self.executor else ParallelState())
            logger.info("Loaded %s (%s, %s) in %.1f s: %s of weights%s",
                        self.model_name, worker.spec.model_type,
                        str(worker.dtype).removeprefix("torch."), worker.load_seconds,
                        format_gib(worker.weight_bytes),
                        f" on rank 0 of {config.tensor_parallel_size} (tensor parallel)"
                        if self.executor else "")
            num_blocks, self.max_model_len = worker.size_pool()
            self.runner = worker.init_cache(num_blocks, self.max_model_len)
        except BaseException:
            self.close()
            raise
        if self.executor is not None:
            self.executor.started()
        self.spec, self.dtype, self.device = worker.spec, worker.dtype, worker.device
        self.backend, self.model = worker.backend, worker.model
        self.bytes_per_token = self.spec.kv_bytes_per_token(
            torch.finfo(self.dtype).bits // 8, config.tensor_parallel_size)
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        pacer = PrefillPacer(config.prefill_pacing) if config.prefill_pacing else None
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens,
                                   pacer)
        self._groups: dict[str, _Group] = {}
        self._seqs: dict[str, _Sequence] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_finished_total = 0
        self.num_steps_total = 0
        self._log_state = (time.monotonic(), 0, 0)

    def close(self) -> None:
        """Stop the tensor-parallel worker processes, if any (idempotent). An engine that is
        never closed stops them when it is garbage-collected or the interpreter exits."""
        if self.executor is not None:
            self.executor.shutdown()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        """A readable name: the directory's, or the GGUF file's stem for a converted GGUF."""
        source = self.model_dir / "SOURCE"
        if source.is_file():
            return Path(source.read_text().strip()).stem
        return self.model_dir.name

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        return [int(t) for t in prompt]

    def check_prompt_length(self, num_prompt_tokens: int, max_tokens: int | None) -> None:
        """Raise PromptTooLongError in vLLM's words when the request cannot fit."""
        mml = self.max_model_len
        if num_prompt_tokens + 1 > mml:
            raise PromptTooLongError(
                f"This model's maximum context length is {mml} tokens. However, your request has "
                f"{num_prompt_tokens} input tokens. Please reduce the length of the input messages."
            )
        if max_tokens is not None and num_prompt_tokens + max_tokens > mml:
            raise PromptTooLongError(
                f"This model's maximum context length is {mml} tokens. However, you requested "
                f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or "
                "completion."
            )

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams, *,
                    user: str | None = None, thread: str | None = None,
                    cache_salt: str | None = None, check_max_tokens: bool = False) -> None:
        """Queue a request. A prompt is text or token ids. Raises PromptTooLongError.

        With check_max_tokens, a max_tokens that would run past max_model_len is refused
        (the server's behaviour); otherwise generation just stops at max_model_len.
        """
        if request_id in self._groups:
            raise ValueError(f"Request id {request_id!r} is already in use.")
        params.validate()
        token_ids = self.encode_prompt(prompt)
        if not token_ids:
            raise ValueError("The prompt is empty.")
        if max(token_ids) >= self.spec.vocab_size or min(token_ids) < 0:
            raise ValueError(f"Prompt token ids must be in [0, {self.spec.vocab_size}).")
        self.check_prompt_length(len(token_ids), params.max_tokens if check_max_tokens else None)
        text = prompt if isinstance(prompt, str) else None
        group = _Group(request_id, text, token_ids)
        for i in range(params.n):
            rid = request_id if params.n == 1 else f"{request_id}#{i}"
            req = Request(rid, token_ids, params, self.eos_token_ids, parent_id=request_id,
                          index=i, user=user, thread=thread, cache_salt=cache_salt, prompt=text)
            detok = IncrementalDetokenizer(self.tokenizer, token_ids, params.stop,
                                           params.skip_special_tokens,
                                           params.include_stop_str_in_output)
            seq = _Sequence(req, detok)
            group.seqs.append(seq)
            self._seqs[rid] = seq
            self.scheduler.add_request(req)
        self._groups[request_id] = group

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks. Returns False if it was unknown/finished."""
        group = self._groups.pop(request_id, None)
        if group is None:
            return False
        for seq in group.seqs:
            if not seq.request.is_finished:
                self._finish(seq.request, RequestStatus.FINISHED_ABORTED)
            self._seqs.pop(seq.request.request_id, None)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # -- stepping ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, update requests; return what changed (deltas).

        A failure while running the batch fails the requests of that batch alone (their
        outputs carry `error`); the engine and every other request go on. The exception is
        a tensor-parallel worker that died (WorkerDiedError): the batch's requests are
        failed, then the error is raised, since no further step can run.
        """
        so = self.scheduler.schedule()
        if so.is_empty:
            return []
        self.num_steps_total += 1
        started = time.perf_counter()
        try:
            sampled_reqs, sampler_out = self._execute(so)
        except Exception as exc:  # noqa: BLE001 - isolate the failure to this batch
            logger.exception("Engine step failed; failing the %d requests of this batch",
                             len(so.scheduled))
            failed = [s.request for s in so.scheduled]
            outputs = self._fail(failed, f"internal error while running the model: {exc}")
            if isinstance(exc, WorkerDiedError):
                raise  # no step can run any more: the engine's owner must restart it
            return outputs
        if self.scheduler.pacer is not None:
            self.scheduler.pacer.observe(so.num_decodes, so.num_prefill_tokens,
                                         time.perf_counter() - started, so.prefill_context)
        now = time.monotonic()
        touched: dict[str, _Group] = {}
        for sched in so.scheduled:
            sched.request.num_computed_tokens += sched.num_new_tokens
        failed: list[Request] = []
        if sampler_out is not None:
            for row, req in enumerate(sampled_reqs):
                if sampler_out.invalid[row]:
                    failed.append(req)
                    continue
                token = sampler_out.token_ids[row]
                try:
                    req.append_output_token(token)
                    self.generation_tokens_total += 1
                    if req.logprobs is not None and sampler_out.logprobs[row] is not None:
                        req.logprobs.append(sampler_out.logprobs[row])  # type: ignore[arg-type]
                    if req.metrics.first_token_time is None:
                        req.metrics.first_token_time = now
                        if req.index == 0:
                            self.prompt_tokens_total += req.num_prompt_tokens
                    req.metrics.last_token_time = now
                    self._check_stop(req, token)
                except Exception:  # noqa: BLE001 - e.g. a tokenizer error fails this request only
                    logger.exception("Processing the output of request %s failed", req.request_id)
                    failed.append(req)
                    continue
                touched[req.output_id] = self._groups[req.output_id]
        outputs = [self._make_output(g) for g in touched.values()
                   if not any(s.request in failed for s in g.seqs)]
        if failed:
            outputs += self._fail(failed, "the model produced invalid values (NaN) for this request"
                                  if sampler_out is not None and any(sampler_out.invalid) else
                                  "internal error while processing this request's output")
        self._maybe_log_stats(now)
        return outputs

    def _execute(self, so: SchedulerOutput) -> tuple[list[Request], SamplerOutput | None]:
        """Run the step here, after telling the other tensor-parallel ranks to run it too."""
        if self.executor is None:
            return self.runner.execute(so)
        batch, sampling = self.runner.batch_for(so)
        self.executor.send_step(batch)
        try:
            return self.runner.execute_batch(batch, sampling)
        except Exception as exc:
            # The other ranks may be waiting in a collective this rank never reached.
            self.executor.mark_broken(f"a step failed on rank 0: {exc}")
            raise

    def _fail(self, requests: list[Request], message: str) -> list[RequestOutput]:
        """End these requests (and their sibling sequences) with an error; free their blocks."""
        outputs = []
        for group_id in dict.fromkeys(r.output_id for r in requests):
            group = self._groups.get(group_id)
            if group is None:
                continue
            for seq in group.seqs:
                if not seq.request.is_finished:
                    seq.request.error = message
                    self._finish(seq.request, RequestStatus.FINISHED_ERROR)
            out = self._make_output(group)
            out.error = message
            outputs.append(out)
        return outputs

    def _check_stop(self, req: Request, token: int) -> None:
        seq = self._seqs[req.request_id]
        p = req.params
        stop_str = seq.detok.add_token(token)
        long_enough = req.num_output_tokens >= p.min_tokens
        if long_enough and not p.ignore_eos and token in self.eos_token_ids:
            self._finish(req, RequestStatus.FINISHED_STOPPED)
        elif long_enough and token in p.stop_token_ids:
            req.stop_reason = token
            self._finish(req, RequestStatus.FINISHED_STOPPED)
        elif stop_str is not None and long_enough:
            req.stop_reason = stop_str
            self._finish(req, RequestStatus.FINISHED_STOPPED)
        elif (p.max_tokens is not None and req.num_output_tokens >= p.max_tokens) or \
                req.num_tokens >= self.max_model_len:
            self._finish(req, RequestStatus.FINISHED_LENGTH)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        scrub = self.scheduler.finish_request(req, status)
        if scrub:
            if self.executor is not None:
                self.executor.send_scrub(scrub)
            self.runner.scrub_blocks(scrub)
        self.runner.sampler.release(req.request_id)
        req.metrics.finished_time = time.monotonic()
        self.num_finished_total += 1

    def _make_output(self, group: _Group) -> RequestOutput:
        outs = []
        for seq in group.seqs:
            req = seq.request
            new_ids = req.output_token_ids[seq.reported_tokens:]
            if not new_ids and not req.is_finished:
                continue
            finish = req.status.finish_reason
            text = seq.detok.take_delta(finished=finish is not None)
            lps = None
            if req.logprobs is not None:
                lps = req.logprobs[seq.reported_logprobs:]
                seq.reported_logprobs = len(req.logprobs)
            seq.reported_tokens = req.num_output_tokens
            outs.append(CompletionOutput(
                index=req.index, text=text, token_ids=new_ids, finish_reason=finish,
                stop_reason=req.stop_reason, logprobs=lps, num_output_tokens=req.num_output_tokens))
        finished = all(s.request.is_finished for s in group.seqs)
        first = group.seqs[0].request
        out = RequestOutput(group.request_id, group.prompt, group.prompt_token_ids, outs, finished,
                            num_cached_tokens=first.num_cached_tokens,
                            metrics=_group_metrics([s.request for s in group.seqs]))
        if finished:
            self._groups.pop(group.request_id, None)
            for seq in group.seqs:
                self._seqs.pop(seq.request.request_id, None)
        return out

    # -- observability -------------------------------------------------------------------
    def stats(self) -> EngineStats:
        pool = self.kv.pool
        running = self.scheduler.running
        allocated = sum(len(r.block_ids) for r in running) * self.kv.block_size
        filled = sum(r.num_computed_tokens for r in running)
        return EngineStats(
            num_blocks_total=pool.num_blocks,
            num_blocks_used=pool.num_used_blocks,
            num_blocks_cached=pool.num_cached_blocks,
            kv_cache_usage=pool.usage(),
            num_running=len(running),
            num_waiting=len(self.scheduler.waiting),
            num_preemptions_total=self.scheduler.num_preemptions_total,
            prefix_cache_queries=self.kv.prefix_cache_queries,
            prefix_cache_hits=self.kv.prefix_cache_hits,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            block_size=self.kv.block_size,
            kv_cache_tokens=pool.num_blocks * self.kv.block_size,
            bytes_per_token=self.bytes_per_token,
            max_model_len=self.max_model_len,
            num_requests_finished_total=self.num_finished_total,
            num_steps_total=self.num_steps_total,
            kv_slots_allocated=allocated,
            kv_slots_filled=filled,
        )

    def _maybe_log_stats(self, now: float) -> None:
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
