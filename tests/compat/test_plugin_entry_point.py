"""How `vllm_rs.vllm_patch` is switched on and off, without vLLM: the entry
point the package declares, `VLLM_RS_PATCH=0`, a missing vLLM, and a vLLM
version that was not checked (a stand-in `vllm` module). These run in the
project's own suite."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest
import tomllib
from vllm_rs import vllm_patch

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def test_the_package_declares_the_vllm_general_plugin():
    entry_points = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"]
    assert entry_points["vllm.general_plugins"] == {"vllm_rs": "vllm_rs.vllm_patch:register"}


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in `vllm` package (in place of a real one, if any, for the
    test): apply() must stop at its version check."""
    module = types.ModuleType("vllm")
    module.__version__ = "0.1.0"
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(vllm_patch, "_applied", False)
    return module


def test_an_unchecked_vllm_version_gets_a_warning_and_no_patch(fake_vllm, caplog):
    with caplog.at_level(logging.WARNING, logger="vllm_rs.vllm_patch"):
        assert vllm_patch.apply() is False
    assert "vLLM 0.1.0 was not checked" in caplog.text and "0.33.0" in caplog.text
    assert not vllm_patch._applied


def test_vllm_rs_patch_0_turns_it_off(fake_vllm, monkeypatch, caplog):
    fake_vllm.__version__ = "0.33.0"
    monkeypatch.setenv(vllm_patch.PATCH_ENV, "0")
    with caplog.at_level(logging.WARNING, logger="vllm_rs.vllm_patch"):
        assert vllm_patch.apply() is False
    assert caplog.text == ""  # off on purpose: nothing to warn about


def test_without_vllm_apply_does_nothing(monkeypatch):
    monkeypatch.setattr(vllm_patch, "_applied", False)
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    assert vllm_patch.apply() is False
    vllm_patch.register()  # what vLLM's plugin loader calls: quiet too
