"""The main loop of a tensor-parallel worker process (ranks 1 .. tp-1).

It starts up in step with rank 0 (engine.worker.worker.Worker), then runs each step that rank 0
broadcasts until told to stop. It never outlives the engine: a thread watches a pipe from
the engine process, whose end-of-file means the engine is gone (closed, crashed, killed),
and exits the process at once; SIGTERM keeps its default (exit); SIGINT is ignored, since
Ctrl-C reaches the whole process group and rank 0 decides.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from officellm.engine.config import EngineConfig
from officellm.engine.distributed.parallel_state import init_parallel_state, join_store
from officellm.engine.kv_plan import KVCacheTooSmallError
from officellm.engine.worker.sampling_metadata import SamplingMetadata
from officellm.engine.worker.worker import Worker, rank_device

logger = logging.getLogger("officellm.engine.worker.tp_worker")

# The messages rank 0 broadcasts: (STEP, StepBatch), (SCRUB, block ids), (SHUTDOWN, None).
STEP, SCRUB, SHUTDOWN = "step", "scrub", "shutdown"


def started_key(rank: int) -> str:
    """The store key a worker sets once its process is up and about to join the group."""
    return f"officellm/worker-started/{rank}"


@dataclass
class WorkerArgs:
    """What a worker process needs to join the group and build its shard."""

    config: EngineConfig
    model_dir: Path
    rank: int
    world_size: int
    store_port: int
    log_level: int = logging.WARNING


def _exit_when_parent_goes(parent: Connection) -> None:
    """End this process as soon as the engine process closes its end of the pipe or dies."""
    def watch() -> None:
        try:
            parent.recv()  # the engine never sends: this returns only by raising at EOF
        except (EOFError, OSError):
            pass
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def worker_main(args: WorkerArgs, parent: Connection) -> None:
    """Entry point of a worker process (multiprocessing spawn target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_when_parent_goes(parent)
    logging.basicConfig(level=args.log_level,
                        format=f"%(asctime)s %(levelname)s (tp rank {args.rank}) %(name)s: "
                               "%(message)s")
    device = rank_device(args.config.device, args.rank)
    store = join_store(args.store_port, args.world_size)
    store.set(started_key(args.rank), "1")  # rank 0 waits for this before it joins the group
    parallel = init_parallel_state(store, args.rank, args.world_size, device)
    try:
        worker = Worker(args.config, args.model_dir, parallel)
        runner = worker.init_cache(*worker.size_pool())
        while True:
            kind, payload = parallel.broadcast_object()
            if kind == STEP:
                runner.execute_batch(payload, SamplingMetadata())
            elif kind == SCRUB:
                runner.scrub_blocks(payload)
            elif kind == SHUTDOWN:
                break
    except KVCacheTooSmallError:
        pass  # rank 0 raises it to the user
    except Exception:
        logger.exception("Tensor-parallel worker rank %d failed", args.rank)
        raise
    finally:
        parallel.destroy()
