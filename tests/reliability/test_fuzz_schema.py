"""Fuzzing from the server's own OpenAPI schema (schemathesis): valid and schema-violating
requests to every public and admin operation (the OpenAI routes, Anthropic's /v1/messages and
count_tokens, vLLM's /tokenize and /detokenize, /health, /metrics, /admin/). No answer is a
5xx, and every error is in its API's shape (Anthropic's on /v1/messages, else OpenAI's).

Bounded for CI: EXAMPLES requests per operation and mode, against a tiny model whose
--max-model-len (128) caps what a fuzzed max_tokens can cost. The counts (examples tried,
failures) are printed and kept as test properties (`-rA` or junit XML show them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from officellm.engine import BUNDLED_EMBEDDER
from tests.reliability.probes import admin_for
from tests.support.openai_errors import is_anthropic_error, is_openai_error
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.slow

EXAMPLES = 40  # per operation and mode: ~1,000 requests, about a minute on two cores
# The public API: OpenAI's and Anthropic's routes, and vLLM's tokenizer routes beside them.
PUBLIC = ("/v1/", "/tokenize", "/detokenize")
ANTHROPIC = "/v1/messages"


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with ServerProcess(str(tiny_model_dir), "--max-model-len", "128", "--max-num-seqs", "16",
                       "--embedding-model", BUNDLED_EMBEDDER,
                       # the fuzzer's requests all come from 127.0.0.1; some carry bad keys
                       "--auth-failure-limit", "0") as srv:
        yield srv


@dataclass
class FuzzReport:
    tried: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    operations: list[str] = field(default_factory=list)

    def merge(self, other: FuzzReport) -> None:
        self.tried += other.tried
        for status, count in other.by_status.items():
            self.by_status[status] = self.by_status.get(status, 0) + count
        self.failures += other.failures
        self.operations += other.operations

    def check(self, label: str, path: str, status: int, content: bytes) -> None:
        self.tried += 1
        self.by_status[status] = self.by_status.get(status, 0) + 1
        if status >= 500:
            self.failures.append(f"{label}: {status} {content[:300]!r}")
        elif status >= 400:
            try:
                body = json.loads(content)
            except ValueError:
                body = None
            if path.startswith(ANTHROPIC):
                if not is_anthropic_error(body):
                    self.failures.append(f"{label}: {status} not in Anthropic's shape: "
                                         f"{content[:300]!r}")
            elif not is_openai_error(body):
                self.failures.append(f"{label}: {status} not in OpenAI's shape: {content[:300]!r}")


# The deprecated function-calling fields are always refused; tools and tool_choice are fuzzed.
TOOL_FIELDS = ("functions", "function_call")
# What the stateless /v1/responses always refuses: stored state (previous_response_id,
# conversation, a stored prompt), background runs, truncation "auto", included logprobs.
STATEFUL_FIELDS = ("previous_response_id", "conversation", "prompt", "background",
                   "truncation", "include")


def _token_ids(prompt: Any) -> Any:
    if isinstance(prompt, int):
        return abs(prompt) % 1000
    if isinstance(prompt, list):
        return [_token_ids(p) for p in prompt if not (isinstance(p, list | str) and not p)] \
            or "Hello"
    return prompt or "Hello"


def reach_the_engine(case: schemathesis.Case) -> None:
    """Steer a valid public request past the refusals the schema cannot express (an unknown
    model name, max_tokens over the context, min_tokens over max_tokens, the deprecated
    function calling, the Responses API's stateful fields, empty prompts, token ids outside
    the vocabulary), so the other fuzzed fields really reach the engine, or the tokenizer.
    The negative mode covers those refusals."""
    body = case.body
    if not (isinstance(body, dict) and case.path.startswith(PUBLIC)):
        return
    body.pop("model", None)
    if isinstance(body.get("max_tokens"), int):
        body["max_tokens"] = min(body["max_tokens"], 8)
    if case.path.startswith(ANTHROPIC):  # its unknown fields are refused: add none
        return
    for key in (*TOOL_FIELDS, *STATEFUL_FIELDS):
        body.pop(key, None)
    for key in ("max_completion_tokens", "max_output_tokens"):
        if isinstance(body.get(key), int):
            body[key] = min(body[key], 8)
    body["min_tokens"] = 0
    if "prompt" in body:
        body["prompt"] = _token_ids(body["prompt"])
    if isinstance(body.get("tokens"), list):  # /detokenize
        body["tokens"] = [abs(t) % 1000 for t in body["tokens"] if isinstance(t, int)]


def fuzz_operation(server: ServerProcess, operation: Any, mode: GenerationMode,
                   headers: dict[str, str], report: FuzzReport) -> None:
    """Up to EXAMPLES requests of one operation in one mode, each checked into `report`."""
    label = f"{operation.method.upper()} {operation.path} [{mode.value}]"

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        if mode is GenerationMode.POSITIVE:
            reach_the_engine(case)
        response = case.call(base_url=server.base_url, headers=headers, timeout=60)
        report.check(label, operation.path, response.status_code, response.content)

    try:
        run()
    except Unsatisfiable:
        # No parameters and no body (GET /v1/models): nothing to make invalid.
        assert mode is GenerationMode.NEGATIVE, label


def fuzz(server: ServerProcess, prefix: str | tuple[str, ...],
         headers: dict[str, str]) -> FuzzReport:
    """Run every operation under `prefix` (or any of them) with EXAMPLES valid and EXAMPLES
    invalid requests."""
    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    report = FuzzReport()
    for result in schema.get_all_operations():
        operation = result.ok()
        if not operation.path.startswith(prefix):
            continue
        report.operations.append(f"{operation.method.upper()} {operation.path}")
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz_operation(server, operation, mode, headers, report)
    return report


def _record(report: FuzzReport, name: str, record_property) -> None:
    record_property(f"{name}_examples_tried", report.tried)
    record_property(f"{name}_failures", len(report.failures))
    print(f"\n{name}: {report.tried} examples over {len(report.operations)} operations, "
          f"{len(report.failures)} failures; statuses {dict(sorted(report.by_status.items()))}")
    for failure in report.failures:
        print("  FAILURE", failure)


def test_the_public_api_never_answers_5xx_and_errors_are_in_their_apis_shape(
        server: ServerProcess, record_property) -> None:
    report = fuzz(server, PUBLIC, server.headers)
    _record(report, "public", record_property)
    assert {"POST /v1/responses", "POST /v1/messages", "POST /v1/messages/count_tokens",
            "POST /tokenize", "POST /detokenize", "POST /v1/embeddings"} <= set(report.operations)
    assert report.tried >= EXAMPLES * len(report.operations)
    assert report.failures == []
    assert report.by_status.get(200, 0) >= EXAMPLES  # the engine really ran fuzzed requests
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


def test_health_and_metrics_never_answer_5xx(server: ServerProcess, record_property) -> None:
    report = fuzz(server, "/health", server.headers)
    report.merge(fuzz(server, "/metrics", server.headers))
    _record(report, "system", record_property)
    assert report.failures == []


# After the public API: the admin fuzzing rewrites policies and users at random.
def test_the_admin_api_never_answers_5xx_and_errors_are_openai_shaped(
        server: ServerProcess, record_property) -> None:
    report = fuzz(server, "/admin/", admin_for(server).headers)
    _record(report, "admin", record_property)
    assert report.tried >= EXAMPLES * len(report.operations)
    assert report.failures == []
