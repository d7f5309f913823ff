"""The real app under uvicorn on a free loopback port, served from a thread of the test's own
process: for tests of the admin API and the console that need HTTP but no model loaded."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI


@contextmanager
def app_in_thread(app: FastAPI, start_timeout_s: float = 60) -> Iterator[str]:
    """Serve `app` until the block ends; yields its base URL (http://127.0.0.1:PORT)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
