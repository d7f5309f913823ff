"""`officellm bench` against a live officellm server: its numbers must agree with the server's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from officellm.cli import build_parser
from tests.support.server_process import ServerProcess

QUANTILES = ("p50", "p90", "p99")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = ServerProcess()  # with an API key: the bench must send it
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def bench(server: ServerProcess, tmp_path: Path, *flags: str) -> dict[str, Any]:
    out = tmp_path / "results.json"
    args = build_parser().parse_args(
        ["bench", "--base-url", server.base_url, "--api-key", server.api_key or "",
         "--think-time", "0.05", "--seed", "7", "--out", str(out), *flags])
    assert args.func(args) == 0
    return json.loads(out.read_text())


def check_consistent(doc: dict[str, Any]) -> None:
    """What every run must satisfy, whatever the scenario."""
    s = doc["summary"]
    reqs = doc["requests"]
    assert doc["schema"] == "officellm-bench/1"
    assert s["requests"]["errors"] == 0, s["errors"]
    assert s["requests"]["sent"] == s["requests"]["completed"] == len(reqs)
    # Token counts are the server's usage, and the server's own counters agree over the run.
    assert s["output_tokens"] == sum(r["completion_tokens"] for r in reqs)
    assert s["prompt_tokens"] == sum(r["prompt_tokens"] for r in reqs)
    m = doc["server_metrics"]
    assert m["generation_tokens"] == s["output_tokens"]
    assert m["prompt_tokens"] == s["prompt_tokens"]
    for r in reqs:
        assert 1 <= r["completion_tokens"] <= r["max_tokens"]
        assert 1 <= r["chunks"] <= r["completion_tokens"]
        assert 0 < r["ttft_s"] <= r["e2e_s"]
    for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
        d = s[key]
        assert d["count"] > 0, key
        assert d["p50"] <= d["p90"] <= d["p99"] <= d["max"], (key, d)
    assert s["itl_s"]["count"] == sum(r["chunks"] - 1 for r in reqs)
    assert s["output_tok_per_s"] == pytest.approx(s["output_tokens"] / s["wall_s"])
    assert s["req_per_s"] == pytest.approx(len(reqs) / s["wall_s"])
    assert sum(p["output_tok_per_s"] for p in doc["timeline"]) == pytest.approx(s["output_tokens"])


def test_office_resends_history_and_counts_match(server: ServerProcess, tmp_path: Path) -> None:
    png = tmp_path / "office.png"
    doc = bench(server, tmp_path, "--scenario", "office", "--users", "2", "--requests", "6",
                "--max-tokens", "12", "--plot", str(png))
    check_consistent(doc)
    assert doc["settings"]["max_context"] == doc["server"]["max_context"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    by_user: dict[int, list[dict[str, Any]]] = {}
    for r in doc["requests"]:
        by_user.setdefault(r["user"], []).append(r)
    assert sorted(by_user) == [0, 1]
    for turns in by_user.values():
        turns.sort(key=lambda r: r["turn"])
        assert [r["turn"] for r in turns] == list(range(len(turns)))
        # Turn k carries turn k-1's prompt and reply, plus a new question.
        for prev, cur in zip(turns, turns[1:]):
            assert cur["prompt_tokens"] > prev["prompt_tokens"] + prev["completion_tokens"]
            assert cur["start_s"] >= prev["start_s"] + prev["e2e_s"] - 1e-3
    # The resent history is what the prefix cache is for.
    assert doc["server_metrics"]["prefix_cache_hit_rate"] > 0.2


def test_shared_prefix_hits_the_cache(server: ServerProcess, tmp_path: Path) -> None:
    doc = bench(server, tmp_path, "--scenario", "shared-prefix", "--users", "2", "--requests",
                "4", "--max-tokens", "8", "--prefix-tokens", "300")
    check_consistent(doc)
    assert all(r["prompt_tokens"] >= 200 for r in doc["requests"])
    assert doc["server_metrics"]["prefix_cache_hit_rate"] > 0.4


def test_burst_sends_all_users_at_once(server: ServerProcess, tmp_path: Path) -> None:
    doc = bench(server, tmp_path, "--scenario", "burst", "--users", "3", "--requests", "3",
                "--max-tokens", "8")
    check_consistent(doc)
    starts = [r["start_s"] for r in doc["requests"]]
    assert len(starts) == 3 and max(starts) - min(starts) < 0.5


@pytest.mark.slow  # CI budget: docs/testing.md
def test_long_doc_measures_chat_itl_around_the_paste(server: ServerProcess,
                                                     tmp_path: Path) -> None:
    # The paste goes in at a chat's first token; 10 s leaves the chats turns after its
    # prefill as well (ITL without a paste), even on a loaded machine.
    doc = bench(server, tmp_path, "--scenario", "long-doc", "--users", "2", "--duration", "10",
                "--max-tokens", "24", "--doc-tokens", "600")
    check_consistent(doc)
    pastes = [r for r in doc["requests"] if r["kind"] == "paste"]
    assert len(pastes) == 1 and pastes[0]["prompt_tokens"] >= 300
    ld = doc["long_doc"]
    assert len(ld["paste_windows_s"]) == 1
    chat_gaps = sum(r["chunks"] - 1 for r in doc["requests"] if r["kind"] == "chat")
    assert ld["itl_during_paste_s"]["count"] + ld["itl_without_paste_s"]["count"] == chat_gaps
    assert ld["itl_without_paste_s"]["count"] > 0


def test_unbounded_run_is_refused(server: ServerProcess, tmp_path: Path) -> None:
    args = build_parser().parse_args(["bench", "--base-url", server.base_url])
    with pytest.raises(ValueError, match="bounded"):
        args.func(args)


def test_noisy_neighbour_reports_light_latency_and_heavy_throughput(server: ServerProcess,
                                                                     tmp_path: Path) -> None:
    doc = bench(server, tmp_path, "--scenario", "noisy-neighbour", "--users", "2",
                "--requests", "4", "--max-tokens", "8", "--heavy-requests", "2",
                "--heavy-doc-tokens", "200", "--heavy-max-tokens", "8", "--heavy-start", "0.3",
                "--ignore-eos")
    check_consistent(doc)
    kinds = [r["kind"] for r in doc["requests"]]
    assert kinds.count("chat") == 4 and kinds.count("heavy") >= 2
    assert {r["user"] for r in doc["requests"] if r["kind"] == "heavy"} == {2}
    nn = doc["noisy_neighbour"]
    assert nn["light"]["requests"]["completed"] == 4
    assert nn["light"]["ttft_s"]["count"] == 4 and nn["light"]["itl_s"]["count"] > 0
    heavy = [r for r in doc["requests"] if r["kind"] == "heavy"]
    assert all(r["prompt_tokens"] > 150 for r in heavy)  # the documents, not chat questions
    assert nn["heavy"]["throughput_tok_per_s"] == pytest.approx(
        sum(r["prompt_tokens"] + r["completion_tokens"] for r in heavy) / doc["summary"]["wall_s"])
    assert doc["settings"]["heavy_requests"] == 2
    assert doc["settings"]["heavy_start_s"] == 0.3
    assert min(r["start_s"] for r in heavy) >= 0.3  # it joined the light users, later


def test_code_edit_sends_a_new_file_each_turn(server: ServerProcess, tmp_path: Path) -> None:
    doc = bench(server, tmp_path, "--scenario", "code-edit", "--users", "1", "--requests", "2",
                "--max-tokens", "12", "--file-tokens", "200")
    check_consistent(doc)
    prompts = [r["prompt_tokens"] for r in doc["requests"]]
    assert all(p >= 150 for p in prompts)
    assert doc["server_metrics"]["prefix_cache_hit_rate"] < 0.5  # each file is new


@pytest.mark.slow  # CI budget: docs/testing.md
def test_agent_turn_resends_the_shared_instructions(server: ServerProcess,
                                                    tmp_path: Path) -> None:
    doc = bench(server, tmp_path, "--scenario", "agent-turn", "--users", "2", "--requests",
                "6", "--max-tokens", "12", "--prefix-tokens", "300")
    check_consistent(doc)
    assert all(r["prompt_tokens"] >= 200 for r in doc["requests"])
    assert all(r["max_tokens"] <= 12 for r in doc["requests"])
    assert doc["server_metrics"]["prefix_cache_hit_rate"] > 0.4
