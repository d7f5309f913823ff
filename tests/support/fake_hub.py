"""A Hugging Face Hub on 127.0.0.1, enough of it for huggingface_hub's downloads: model info
with file sizes (`GET /api/models/{repo}/revision/{rev}`) and file resolution (`HEAD` and
`GET /{repo}/resolve/{rev}/{path}` with X-Repo-Commit, ETag and Content-Length). It serves
one repo from a dict of files and logs every request, so a test can tell what was fetched."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """`files`: path in the repo -> bytes. `fail_once`: paths whose first GET answers 403,
    as a download cut short would leave them."""

    def __init__(self, repo_id: str, files: dict[str, bytes]) -> None:
        self.repo_id, self.files = repo_id, files
        self.fail_once: set[str] = set()
        self.requests: list[tuple[str, str]] = []  # (method, path)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet test output
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def do_GET(self) -> None:
                hub._answer(self, body=True)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def downloads(self) -> list[str]:
        """The repo paths whose content was sent (GETs of /resolve/)."""
        marker = f"/{self.repo_id}/resolve/"
        return [unquote(p.split(marker, 1)[1].split("/", 1)[1])
                for m, p in self.requests if m == "GET" and marker in p]

    def _answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = urlsplit(handler.path).path
        self.requests.append((handler.command, path))
        if path.startswith(f"/api/models/{self.repo_id}"):
            return self._send(handler, 200, json.dumps(self._info()).encode(),
                              {"Content-Type": "application/json"}, body)
        prefix = f"/{self.repo_id}/resolve/"
        if not path.startswith(prefix):
            return self._send(handler, 404, b'{"error": "not found"}', {}, body)
        name = unquote(path[len(prefix):].split("/", 1)[1])
        if name not in self.files:
            return self._send(handler, 404, b'{"error": "Entry not found"}',
                              {"X-Error-Code": "EntryNotFound"}, body)
        if body and name in self.fail_once:
            self.fail_once.discard(name)
            return self._send(handler, 403, b'{"error": "cut off"}', {}, body)
        data = self.files[name]
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                   "Content-Type": "application/octet-stream"}
        return self._send(handler, 200, data, headers, body)

    def _info(self) -> dict:
        return {"id": self.repo_id, "sha": COMMIT,
                "siblings": [{"rfilename": name, "size": len(data),
                              "blobId": hashlib.sha1(data).hexdigest()}
                             for name, data in sorted(self.files.items())]}

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, data: bytes,
              headers: dict[str, str], body: bool) -> None:
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)
