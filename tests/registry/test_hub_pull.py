"""`pull` against a Hub on 127.0.0.1: the files a model needs arrive byte-identical, the rest
stay behind, progress reaches the total, and a second pull fetches nothing again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from officellm.app.registry.hub_pull import (
    default_models_dir,
    pull,
    pulled_dir,
    select_files,
)
from tests.registry.conftest import REPO
from tests.support.fake_hub import FakeHub

NEEDED = {"config.json", "tokenizer.json", "model.safetensors"}


def test_the_needed_files_arrive_byte_identical(hub: FakeHub, tmp_path: Path) -> None:
    dest = tmp_path / "tiny"
    assert pull(REPO, dest) == dest
    for name in NEEDED:
        assert (dest / name).read_bytes() == hub.files[name], name


def test_other_checkpoints_and_other_runtimes_files_are_not_fetched(
        hub: FakeHub, tmp_path: Path) -> None:
    pull(REPO, tmp_path / "tiny")
    assert set(hub.downloads()) == NEEDED
    assert not (tmp_path / "tiny" / "pytorch_model.bin").exists()


def test_progress_counts_up_to_the_total(hub: FakeHub, tmp_path: Path) -> None:
    seen: list[tuple[int, int | None]] = []
    pull(REPO, tmp_path / "tiny", progress=lambda done, total: seen.append((done, total)))
    total = sum(len(hub.files[n]) for n in NEEDED)
    assert seen[0] == (0, total)
    assert seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    # The weights' bytes are reported as they arrive, not only when their file is done.
    assert len(seen) > len(NEEDED) + 1


def test_a_second_pull_downloads_nothing_and_still_reports_the_total(
        hub: FakeHub, tmp_path: Path) -> None:
    pull(REPO, tmp_path / "tiny")
    first = len(hub.downloads())
    seen: list[tuple[int, int | None]] = []
    pull(REPO, tmp_path / "tiny", progress=lambda done, total: seen.append((done, total)))
    assert len(hub.downloads()) == first
    assert seen[-1][0] == seen[-1][1]


def test_a_pull_cut_off_continues_with_what_is_missing(hub: FakeHub, tmp_path: Path) -> None:
    hub.fail_once.add("model.safetensors")
    with pytest.raises(Exception, match="403"):
        pull(REPO, tmp_path / "tiny")
    assert (tmp_path / "tiny" / "config.json").read_bytes() == hub.files["config.json"]
    before = len(hub.downloads())
    pull(REPO, tmp_path / "tiny")
    assert hub.downloads()[before:] == ["model.safetensors"]
    assert (tmp_path / "tiny" / "model.safetensors").read_bytes() == \
        hub.files["model.safetensors"]


def test_a_gguf_only_repo_needs_the_file_named(hub: FakeHub, tmp_path: Path) -> None:
    hub.files.clear()
    hub.files.update({"tiny.Q4_0.gguf": b"GGUF" + b"\0" * 60, "tiny.Q8_0.gguf": b"GGUF" * 20,
                      "README.md": b"# tiny\n"})
    with pytest.raises(ValueError, match="choose one with --filename: tiny.Q4_0.gguf, "
                                         "tiny.Q8_0.gguf"):
        pull(REPO, tmp_path / "tiny")
    source = pull(REPO, tmp_path / "tiny", filename="tiny.Q8_0.gguf")
    assert source == tmp_path / "tiny" / "tiny.Q8_0.gguf"
    assert source.read_bytes() == hub.files["tiny.Q8_0.gguf"]
    assert hub.downloads() == ["tiny.Q8_0.gguf"]


def test_an_unknown_repo_file_is_refused_naming_what_there_is() -> None:
    with pytest.raises(ValueError, match="no file 'x.gguf'; it has a.gguf"):
        select_files(["a.gguf"], "x.gguf")


def test_a_repo_of_pickled_weights_only_is_refused() -> None:
    with pytest.raises(ValueError, match="neither safetensors weights nor a .gguf"):
        select_files(["config.json", "pytorch_model.bin"])


def test_a_lone_gguf_is_chosen_without_a_filename() -> None:
    assert select_files(["README.md", "m.Q4_K_M.gguf"]) == ["m.Q4_K_M.gguf"]


def test_tokenizer_and_sentence_transformers_files_are_selected() -> None:
    files = ["modules.json", "1_Pooling/config.json", "sentence_bert_config.json", "vocab.txt",
             "merges.txt", "tokenizer.model", "chat_template.jinja",
             "model-00001-of-00002.safetensors", "model.safetensors.index.json",
             "openvino/openvino_model.xml", "original/consolidated.00.pth", "rust_model.ot",
             "flax_model.msgpack", "tf_model.h5"]
    assert set(select_files(files)) == set(files[:9])


def test_pulled_models_live_in_the_data_directory(tmp_path: Path) -> None:
    assert default_models_dir() == tmp_path / "data" / "models"
    assert pulled_dir("Qwen/Qwen3-8B") == tmp_path / "data" / "models" / "Qwen--Qwen3-8B"


def test_an_architecture_the_engine_cannot_run_stops_the_pull_before_the_weights(
        hub: FakeHub, tmp_path: Path) -> None:
    from officellm.engine import UnsupportedModelError, check_architecture

    hub.files["config.json"] = json.dumps({"model_type": "mamba",
                                           "architectures": ["MambaForCausalLM"]}).encode()
    with pytest.raises(UnsupportedModelError, match="MambaForCausalLM.*officellm supports"):
        pull(REPO, tmp_path / "tiny", check_config=check_architecture)
    assert "model.safetensors" not in hub.downloads()


def test_a_mixture_of_experts_repo_passes_the_architecture_check(
        hub: FakeHub, tmp_path: Path) -> None:
    from officellm.engine import check_architecture
    from tests.support.tiny_models import tiny_config

    hub.files["config.json"] = tiny_config("qwen3_moe", 256).to_json_string().encode()
    assert pull(REPO, tmp_path / "tiny", check_config=check_architecture) == tmp_path / "tiny"
    assert "model.safetensors" in hub.downloads()
