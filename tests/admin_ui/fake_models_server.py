"""A small, real HTTP server for the Models tab's widget tests: the model registry's admin
routes (docs/admin_api.md, `/admin/models`) and `/admin/stats` with its `models`, kept in
memory. The tab's own AdminClient talks to it over a socket, so the tests exercise the real
HTTP client; the acceptance tests check the console against the real server.

Only the contract's shapes are modelled: a load fits the budget or is refused with a 503 and a
sentence, a Hub download moves when the test says so, nothing takes time.
"""

from __future__ import annotations

import copy
import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.admin_ui.samples import stats_json

GiB = 1024**3
TOKEN = "ocl-admin-fake"
IN_MEMORY = ("loading", "ready", "sleeping")


def model_row(name: str, **fields: Any) -> dict[str, Any]:
    """A whole registry row as the contract spells it; `fields` override the defaults."""
    row: dict[str, Any] = {
        "name": name, "source": f"/models/{name}", "kind": "generate", "pinned": False,
        "aliases": [], "sleep_idle_seconds": None, "options": {}, "hub_repo": None,
        "state": "unloaded", "memory_bytes": 1 * GiB, "weight_bytes": int(0.75 * GiB),
        "kv_cache_bytes": int(0.25 * GiB), "last_used": None, "fits": True, "error": None,
        "requests_running": 0, "kv_cache_usage": None, "download": None, "default": False,
    }
    row.update(fields)
    return row


def _error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class FakeModelsServer:
    """The registry in memory behind a threaded http.server on 127.0.0.1 (a free port).
    `requests` records each (method, path, JSON body) the console sent, in order."""

    def __init__(self, rows: list[dict[str, Any]], budget_bytes: int = 8 * GiB) -> None:
        self.budget_bytes = budget_bytes
        self.rows: dict[str, dict[str, Any]] = {r["name"]: copy.deepcopy(r) for r in rows}
        self.requests: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()
        # Cleared, a listing is worked out when asked but its answer waits until set again:
        # an answer that left before an action arrives after it.
        self.listings_flow = threading.Event()
        self.listings_flow.set()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        name="fake-models-server")

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeModelsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    # --- what the test moves by hand -------------------------------------------------------
    def set_download(self, name: str, bytes_done: int, bytes_total: int | None) -> None:
        with self.lock:
            self.rows[name]["download"] = {"bytes_done": bytes_done, "bytes_total": bytes_total}

    def finish_download(self, name: str) -> None:
        with self.lock:
            row = self.rows[name]
            row.update(state="unloaded", download=None, source=f"/hub/{row['hub_repo']}")

    def sent(self, method: str, path: str) -> list[Any]:
        """The bodies of the requests sent with this method to this path."""
        with self.lock:
            return [body for m, p, body in self.requests if (m, p) == (method, path)]

    # --- the contract ----------------------------------------------------------------------
    def _used(self) -> int:
        return sum(r["memory_bytes"] or 0 for r in self.rows.values() if r["state"] in IN_MEMORY)

    def _fits(self, row: dict[str, Any]) -> bool:
        return (row["memory_bytes"] or 0) <= self.budget_bytes

    def _listing(self) -> dict[str, Any]:
        for r in self.rows.values():
            r["fits"] = self._fits(r)
        return {"budget_bytes": self.budget_bytes, "used_bytes": self._used(),
                "models": [copy.deepcopy(r) for r in self.rows.values()]}

    def _stats(self) -> dict[str, Any]:
        body = stats_json()
        body["models"] = [
            {"name": r["name"], "state": r["state"], "kv_cache_usage": r["kv_cache_usage"],
             "num_blocks_total": 100, "num_blocks_used": round((r["kv_cache_usage"] or 0) * 100),
             "num_running": r["requests_running"], "num_waiting": 0}
            for r in self.rows.values() if r["kind"] == "generate" and r["state"] in IN_MEMORY]
        return body

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """(status, JSON or None) for one request: the routes of the contract."""
        with self.lock:
            self.requests.append((method, path, body))
            parts = [unquote(p) for p in path.strip("/").split("/")]
            if (method, parts) == ("GET", ["admin", "stats"]):
                return 200, self._stats()
            if parts[:2] != ["admin", "models"]:
                return 404, {"detail": "Not Found"}
            if len(parts) == 2:
                if method == "GET":
                    return 200, self._listing()
                if method == "POST":
                    return self._add(body or {})
            elif len(parts) in (3, 4):
                row = self.rows.get(parts[2])
                if row is None:
                    return 404, _error(f"No model is registered as {parts[2]!r}.")
                action = (method, parts[3] if len(parts) == 4 else None)
                if action == ("DELETE", None):
                    del self.rows[row["name"]]
                    return 204, None
                if action == ("PATCH", None):
                    row["pinned"] = bool((body or {}).get("pinned"))
                    return 200, copy.deepcopy(row)
                if action == ("POST", "load"):
                    return self._load(row)
                if action == ("POST", "unload"):
                    row.update(state="unloaded", kv_cache_usage=None, requests_running=0)
                    return 200, copy.deepcopy(row)
            return 405, _error(f"{method} {path} is not a route.")

    def _add(self, body: dict[str, Any]) -> tuple[int, Any]:
        name = str(body.get("name") or "")
        if not name or name in self.rows:
            return 400, _error(f"A model named {name!r} is registered already." if name
                               else "name is required.")
        if not body.get("source") and not body.get("hub_repo"):
            return 400, _error("Give a source or a hub_repo.")
        fields = {k: body[k] for k in ("kind", "pinned", "aliases", "options", "sleep_idle_seconds")
                  if k in body}
        row = model_row(name, source=body.get("source") or "", hub_repo=body.get("hub_repo"),
                        **fields)
        if not body.get("source"):  # from the Hub: downloading in the background
            row.update(state="downloading", download={"bytes_done": 0, "bytes_total": None})
        self.rows[name] = row
        return 201, copy.deepcopy(row)

    def _load(self, row: dict[str, Any]) -> tuple[int, Any]:
        free = self.budget_bytes - self._used()
        if row["state"] not in IN_MEMORY and (row["memory_bytes"] or 0) > free:
            return 503, _error(
                f"{row['name']} needs {row['memory_bytes'] / GiB:.1f} GiB but only "
                f"{free / GiB:.1f} GiB of the {self.budget_bytes / GiB:.1f} GiB memory budget "
                "is free: unload a model, or raise --memory-budget.", "server_error")
        row.update(state="ready", kv_cache_usage=0.0,
                   last_used=datetime.now(timezone.utc).isoformat())
        return 200, copy.deepcopy(row)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._reply(401, _error("Invalid admin token.", "authentication_error"))
                    return
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                path = urlsplit(self.path).path
                status, answer = fake.answer(self.command, path, body)
                if (self.command, path) == ("GET", "/admin/models"):
                    fake.listings_flow.wait(10)
                self._reply(status, answer)

            def _reply(self, status: int, answer: Any) -> None:
                data = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                if answer is not None:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _serve  # noqa: N815 - http.server's names

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # quiet: pytest shows what matters

        return Handler
