"""`vllm_rs.frontend_binary()` and the packaging of the native `vllm-rs` executable."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import vllm_rs
from vllm_rs.serving import frontend_binary as frontend


def test_installed_binary_is_native_and_on_the_environment_path():
    path = vllm_rs.frontend_binary()
    assert Path(path).parent == Path(sysconfig.get_path("scripts"))
    with open(path, "rb") as f:
        assert f.read(4) == b"\x7fELF", "the installed vllm-rs must be the native executable, not a script"
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("vllm-rs ")


def test_override_wins(monkeypatch, tmp_path):
    fake = tmp_path / "my-frontend"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(frontend.FRONTEND_PATH_ENV, str(fake))
    assert vllm_rs.frontend_binary() == str(fake)


def test_bad_override_raises_naming_it(monkeypatch, tmp_path):
    missing = tmp_path / "nope"
    monkeypatch.setenv(frontend.FRONTEND_PATH_ENV, str(missing))
    with pytest.raises(FileNotFoundError, match="VLLM_RS_FRONTEND_PATH") as info:
        vllm_rs.frontend_binary()
    assert str(missing) in str(info.value)


def test_another_vllm_rs_on_path_is_never_used(monkeypatch, tmp_path):
    """Without the package's own executable, a `vllm-rs` on PATH (maybe
    another version's) is not taken: the error says where it looked."""
    monkeypatch.delenv(frontend.FRONTEND_PATH_ENV, raising=False)

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(frontend.importlib.metadata, "distribution", not_installed)
    stranger = tmp_path / "vllm-rs"
    stranger.write_text("#!/bin/sh\nexit 0\n")
    stranger.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError) as info:
        frontend.frontend_binary()
    message = str(info.value)
    assert "vllm-rs distribution" in message and frontend.FRONTEND_PATH_ENV in message
    assert str(stranger) not in message


def test_importing_the_package_stays_cheap():
    code = "import sys, vllm_rs; print('vllm_rs.serving.frontend_binary' in sys.modules, 'sysconfig' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ})
    assert out.stdout.split() == ["False", "False"]
    code = "import sys, vllm_rs; vllm_rs.frontend_binary; print('vllm_rs.serving.frontend_binary' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
