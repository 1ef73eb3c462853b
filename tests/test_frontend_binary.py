"""`vllm_rs.frontend_binary()` and the packaging of the native `vllm-rs` executable."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import vllm_rs
from vllm_rs import frontend


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


def test_missing_binary_raises_naming_where_it_looked(monkeypatch, tmp_path):
    monkeypatch.delenv(frontend.FRONTEND_PATH_ENV, raising=False)
    monkeypatch.setattr(frontend.sysconfig, "get_path", lambda name: str(tmp_path / "scripts"))
    monkeypatch.setattr(frontend.sys, "executable", str(tmp_path / "py" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError) as info:
        frontend.frontend_binary()
    message = str(info.value)
    assert str(tmp_path / "scripts" / "vllm-rs") in message
    assert str(tmp_path / "py" / "vllm-rs") in message
    assert "PATH" in message


def test_importing_the_package_stays_cheap():
    code = "import sys, vllm_rs; print('vllm_rs.frontend' in sys.modules, 'sysconfig' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ})
    assert out.stdout.split() == ["False", "False"]
    code = "import sys, vllm_rs; vllm_rs.frontend_binary; print('vllm_rs.frontend' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
