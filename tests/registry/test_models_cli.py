"""`officellm models ...` through the real entry point (cli.main) on a temporary SQLite
file; `pull` against the fake Hub on 127.0.0.1; `load`/`unload` with no server there."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from officellm.app.db.database import Database
from officellm.app.db.registered_models import get_entry, list_entries
from officellm.app.registry.entry import ModelEntry
from officellm.cli import main
from tests.registry.conftest import REPO
from tests.support.fake_hub import FakeHub


def run(capsys, db_path: Path, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--db", str(db_path)])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def _entries(db_path: Path) -> list[ModelEntry]:
    db = Database(db_path)
    db.upgrade()  # a command refused before it opened the database left no file
    try:
        with db.session() as s:
            return list_entries(s)
    finally:
        db.close()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "officellm.db"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "Qwen3-8B"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def test_add_stores_every_option_and_the_source_absolute(
        capsys, db_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(model_dir.parent)
    code, out, err = run(capsys, db_path, "models", "add", "qwen", "Qwen3-8B", "--pin",
                         "--alias", "gpt-4*", "--alias", "qwen*", "--sleep-idle-seconds", "600",
                         "--dtype", "bfloat16", "--quantization", "int8",
                         "--kv-cache-dtype", "fp8_e4m3", "--max-model-len", "8192",
                         "--kv-cache-memory", "4GiB", "--tool-call-parser", "hermes",
                         "--reasoning-parser", "qwen3")
    assert code == 0, err
    assert "registered qwen (generate, pinned)" in out
    assert _entries(db_path) == [ModelEntry(
        name="qwen", source=str(model_dir.resolve()), pinned=True, aliases=("gpt-4*", "qwen*"),
        sleep_idle_seconds=600.0,
        options={"dtype": "bfloat16", "quantization": "int8", "kv_cache_dtype": "fp8_e4m3",
                 "max_model_len": 8192, "kv_cache_memory": "4GiB",
                 "tool_call_parser": "hermes", "reasoning_parser": "qwen3"})]


def test_add_list_pin_unpin_remove_round_trip(capsys, db_path: Path, model_dir: Path) -> None:
    assert run(capsys, db_path, "models", "add", "minilm", "bundled", "--kind", "embed")[0] == 0
    assert run(capsys, db_path, "models", "add", "qwen", str(model_dir))[0] == 0
    code, out, _ = run(capsys, db_path, "models", "list", "--json")
    listed = json.loads(out)
    assert [(m["name"], m["kind"], m["pinned"]) for m in listed] == [
        ("minilm", "embed", False), ("qwen", "generate", False)]

    assert run(capsys, db_path, "models", "pin", "qwen")[0] == 0
    code, out, _ = run(capsys, db_path, "models", "list")
    qwen_line = next(line for line in out.splitlines() if line.startswith("qwen"))
    assert "yes" in qwen_line and str(model_dir) in qwen_line
    assert run(capsys, db_path, "models", "unpin", "qwen")[0] == 0
    assert [e.pinned for e in _entries(db_path)] == [False, False]

    code, out, _ = run(capsys, db_path, "models", "remove", "minilm")
    assert code == 0 and "removed minilm" in out
    assert [e.name for e in _entries(db_path)] == ["qwen"]


def test_an_empty_registry_says_how_to_add_one(capsys, db_path: Path) -> None:
    code, out, _ = run(capsys, db_path, "models", "list")
    assert code == 0 and "no models registered" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--tool-call-parser", "xml"], "invalid choice: 'xml'"),
    (["--kind", "chat"], "invalid choice: 'chat'"),
    (["--max-model-len", "lots"], "invalid int value: 'lots'"),
    (["--max-model-len", "1"], "max_model_len must be at least 2"),
    (["--kv-cache-memory", "plenty"], "Cannot read a memory size from 'plenty'"),
    (["--dtype", "int3"], "dtype must be auto, float32, bfloat16 or float16"),
    (["--quantization", "int2"], "Unknown quantization 'int2'"),
    (["--sleep-idle-seconds", "-1"], "sleep_idle_seconds must be 0 (never) or more"),
])
def test_a_bad_option_is_refused_clearly_and_nothing_is_stored(
        capsys, db_path: Path, argv: list[str], message: str) -> None:
    code, _, err = run(capsys, db_path, "models", "add", "m", "bundled", *argv)
    assert code == 2 and message in err
    assert _entries(db_path) == []


def test_a_missing_source_is_refused(capsys, db_path: Path, tmp_path: Path) -> None:
    code, _, err = run(capsys, db_path, "models", "add", "m", str(tmp_path / "nowhere"))
    assert code == 2 and "No such model directory or .gguf file" in err
    assert _entries(db_path) == []


def test_a_file_that_is_not_a_gguf_is_refused(capsys, db_path: Path, tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"\0")
    code, _, err = run(capsys, db_path, "models", "add", "m", str(tmp_path / "model.bin"))
    assert code == 2 and "neither a model directory nor a .gguf file" in err


def test_a_taken_name_is_refused(capsys, db_path: Path) -> None:
    assert run(capsys, db_path, "models", "add", "m", "bundled")[0] == 0
    code, _, err = run(capsys, db_path, "models", "add", "m", "bundled", "--kind", "embed")
    assert code == 2 and "A model named 'm' is already registered" in err
    assert [e.kind for e in _entries(db_path)] == ["generate"]


@pytest.mark.parametrize("command", ["remove", "pin", "unpin"])
def test_an_unknown_name_is_an_error(capsys, db_path: Path, command: str) -> None:
    code, _, err = run(capsys, db_path, "models", command, "ghost")
    assert code == 2 and "No model named 'ghost' is registered" in err


def test_pull_downloads_into_the_data_directory_and_registers_it(
        capsys, db_path: Path, hub: FakeHub, tmp_path: Path) -> None:
    code, out, err = run(capsys, db_path, "models", "pull", REPO, "--pin")
    assert code == 0, err
    dest = tmp_path / "data" / "models" / "office--tiny-model"
    assert (dest / "model.safetensors").read_bytes() == hub.files["model.safetensors"]
    assert "pulling office/tiny-model:" in err and "(100%)" in err
    db = Database(db_path)
    with db.session() as s:
        entry = get_entry(s, "tiny-model")
    db.close()
    assert entry == ModelEntry(name="tiny-model", source=str(dest), pinned=True,
                               hub_repo=REPO)


def test_pull_refuses_a_taken_name_before_downloading(
        capsys, db_path: Path, hub: FakeHub) -> None:
    assert run(capsys, db_path, "models", "add", "tiny-model", "bundled")[0] == 0
    code, _, err = run(capsys, db_path, "models", "pull", REPO)
    assert code == 2 and "already registered; choose another with --name" in err
    assert hub.downloads() == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", ["load", "unload"])
def test_load_and_unload_say_when_no_server_answers(
        capsys, db_path: Path, tmp_path: Path, command: str) -> None:
    token = tmp_path / "token"
    token.write_text("ocl-admin-x\n")
    url = f"http://127.0.0.1:{_free_port()}"
    code, _, err = run(capsys, db_path, "models", command, "qwen", "--url", url,
                       "--token-file", str(token))
    assert code == 1
    assert f"no server answers at {url}" in err


def test_load_without_a_token_file_names_where_it_looked(capsys, db_path: Path) -> None:
    code, _, err = run(capsys, db_path, "models", "load", "qwen")
    assert code == 2 and f"No admin token at {db_path.parent / 'admin_token'}" in err
