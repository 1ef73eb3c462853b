"""`vllm_rs.engine.cuda_probe`, which lets `serve`'s supervisor resolve
`--device auto` without importing torch: it answers what torch answers, on
this machine, whatever it has (on a CUDA machine, with the devices hidden
too), and a failed driver query is an error that says how it failed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from vllm_rs.engine.cuda_probe import cuda_available, driver_devices, torch_cuda_version


def torch_answers(env: dict[str, str]) -> tuple[str | None, bool]:
    """`torch.version.cuda` and `torch.cuda.is_available()` in a fresh
    interpreter with `env` added (torch reads `CUDA_VISIBLE_DEVICES` once)."""
    code = "import torch; print(torch.version.cuda); print(torch.cuda.is_available())"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )
    assert result.returncode == 0, result.stderr
    version, available = result.stdout.split()
    return (None if version == "None" else version), available == "True"


@pytest.mark.parametrize("env", [{}, {"CUDA_VISIBLE_DEVICES": ""}], ids=["as-is", "devices-hidden"])
def test_the_probe_answers_what_torch_answers(env, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    version, available = torch_answers(env)
    assert torch_cuda_version() == version
    assert cuda_available() == available


def test_a_failed_driver_query_raises_with_its_exit_status(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match=r"asking the CUDA driver for its devices failed \(exit 1\)"):
        driver_devices()
