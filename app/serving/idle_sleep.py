"""Idle sleep (`--sleep-idle-seconds N`, llama.cpp's name): after N seconds without a
request the model's weights and KV pool are freed (AsyncLLM.sleep), so the machine's memory
is the office's again at night; the next request loads it back (ServerState.ensure_awake)
and waits for it, as for a queue."""

from __future__ import annotations

import asyncio
import logging
import time

from officellm.app.serving.state import ServerState
from officellm.engine import EngineState

logger = logging.getLogger("officellm.server")


async def run_idle_sleep(server: ServerState, idle_seconds: float) -> None:
    """Put the model to sleep once nothing has been admitted or released for
    `idle_seconds` and nothing runs; checked a few times per `idle_seconds`."""
    interval = min(1.0, idle_seconds / 4)
    while True:
        await asyncio.sleep(interval)
        engine, admission = server.async_engine, server.admission
        idle = time.monotonic() - admission.last_active
        if (engine.state is EngineState.READY and admission.in_flight == 0
                and idle >= idle_seconds and engine.sleep()):
            logger.info("No request for %.0f s: the model sleeps (its weights and KV pool "
                        "are freed; the next request loads it again)", idle)
