"""A model that nothing else names is served under default_model_name, decided from what
`--model` names before anything loads; it must be the name the loaded engine reports, or a
front end polling /v1/models during a start would see the model change its id."""

from __future__ import annotations

from pathlib import Path

from officellm.engine.loading.model_loader import (
    bundled_model_path,
    default_model_name,
    model_display_name,
    resolve_model_dir,
)


def test_the_name_before_loading_is_the_loaded_models_name(tmp_path: Path) -> None:
    gguf = bundled_model_path()
    link = tmp_path / "office-model.gguf"  # a link is named by the file it points to
    link.symlink_to(gguf)
    hf_dir = tmp_path / "my-model"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text("{}")
    described = resolve_model_dir(gguf)  # the GGUF's description in the cache
    for model in (None, str(gguf), str(link), str(described), str(hf_dir),
                  str(hf_dir / "config.json")):
        assert default_model_name(model) == model_display_name(resolve_model_dir(model)), model
    assert default_model_name(str(link)) == default_model_name(None) == gguf.stem
    assert default_model_name(str(hf_dir)) == "my-model"
