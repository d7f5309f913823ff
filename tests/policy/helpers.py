"""Test helpers: the admin API over httpx, users with keys, metric scraping."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from officellm.engine.llm import apply_chat_template
from tests.support.server_process import ServerProcess

TIMEOUT = 120.0


class Admin:
    """The admin API with the token read from the admin_token file beside the database."""

    def __init__(self, base_url: str, db_path: Path) -> None:
        self.base_url = base_url
        self.db_path = db_path
        token_file = db_path.parent / "admin_token"
        self.token = token_file.read_text().strip()
        self.token_file = token_file

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def request(self, method: str, path: str, expect: int | None = 200, **kw: Any) -> Any:
        r = httpx.request(method, f"{self.base_url}/admin{path}", headers=self.headers,
                          timeout=TIMEOUT, **kw)
        if expect is not None:
            assert r.status_code == expect, (r.status_code, r.text)
        return r.json() if r.content else None

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def user_with_key(self, name: str, **policy: Any) -> str:
        """Create `name` (with an override if `policy` is given); return a raw key."""
        self.request("POST", "/users", json={"name": name}, expect=201)
        if policy:
            self.request("PUT", f"/policies/users/{name}", json=policy)
        return self.request("POST", "/keys", json={"user": name}, expect=201)["key"]


@dataclass
class Office:
    server: ServerProcess
    admin: Admin

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=key, timeout=TIMEOUT,
                             max_retries=0)

    def metrics(self, key: str) -> dict[tuple[str, tuple], float]:
        r = httpx.get(f"{self.base_url}/metrics", headers={"Authorization": f"Bearer {key}"},
                      timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        out = {}
        for family in text_string_to_metric_families(r.text):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out


def metric(samples: dict, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def chat(turns: int, words: int = 5, system: str | None = "You are brief.",
         tag: str = "") -> list[dict[str, str]]:
    """A conversation of `turns` user messages (the last unanswered), each about `words` words."""
    msgs: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    for i in range(turns):
        msgs.append({"role": "user", "content": f"{tag} question {i}: " + "apple " * words})
        if i < turns - 1:
            msgs.append({"role": "assistant", "content": f"answer {i}: " + "pear " * words})
    return msgs


def count_tokens(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    """The prompt's tokens as the engine builds it (the chat template, generation prompt on)."""
    return len(apply_chat_template(tokenizer, messages, True))
