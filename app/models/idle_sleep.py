"""Idle sleep (`--sleep-idle-seconds N`, llama.cpp's name; per model in the registry):
after N seconds without a request a model's weights and KV pool are freed, so the machine's
memory is the office's again at night; the next request loads it back (ModelPool.load) and
waits for it, as for a queue."""

from __future__ import annotations

import asyncio

from officellm.app.models.model_pool import ModelPool

# How often the models' idle clocks are read.
CHECK_INTERVAL_S = 0.25


async def run_idle_sleep(pool: ModelPool) -> None:
    """Put each model to sleep once nothing has used it for its idle time."""
    while True:
        await asyncio.sleep(CHECK_INTERVAL_S)
        await pool.sleep_idle()
