"""Which attention backend the engine picks by default, and that a slower fallback says so."""

from __future__ import annotations

import logging

import pytest
import torch

from officellm.engine.attention import selection

CUDA = torch.device("cuda")  # a device name only: nothing here touches a GPU


def test_a_cuda_device_without_triton_runs_torch_and_warns_why(monkeypatch, caplog):
    monkeypatch.setattr(selection, "triton_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="officellm.engine.attention.selection"):
        assert selection.backend_for(CUDA) == "torch"
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "Triton cannot be imported" in record.getMessage()
    assert "pip install 'officellm[gpu]'" in record.getMessage()


def test_a_cuda_device_with_triton_runs_triton_without_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(selection, "triton_available", lambda: True)
    with caplog.at_level(logging.WARNING, logger="officellm.engine.attention.selection"):
        assert selection.backend_for(CUDA) == "triton"
    assert caplog.records == []


def test_asking_for_triton_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(selection, "triton_available", lambda: False)
    with pytest.raises(ValueError, match="needs Triton"):
        selection.backend_for(CUDA, "triton")
