"""Writes tests/fixtures/vllm-0.33/metrics_families.json: the metric families
vLLM 0.33's own frontend serves in front of this project's reference engine
after the traffic of tests/support/metrics_traffic.py, each with its type,
label names and bucket bounds.

Run it with the project's venv (it needs `openai` and the built package on
`PYTHONPATH`), naming vLLM 0.33's bundled frontend binary:

    PYTHONPATH=python:. ~/.cache/vllm-rs/venv/bin/python scripts/make_metrics_fixture.py \\
        ~/.cache/vllm033/lib/python3.11/site-packages/vllm/vllm-rs

`python -m vllm_rs serve` runs the binary `VLLM_RS_FRONTEND_PATH` names, and
vLLM's takes the same command line as this project's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from vllm_rs.engine.model_loader.registry import write_model_dir

from tests.support import metrics_traffic as traffic
from tests.support.prometheus_text import parse

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-0.33" / "metrics_families.json"
READY_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base_url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        assert proc.poll() is None, "serve exited before it was ready"
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:  # not listening yet, or not answering yet
            pass
        assert time.monotonic() < deadline, "serve did not become healthy"
        time.sleep(0.2)


def idle_metrics(base_url: str) -> str:
    """/metrics once the engine reported itself idle (its last stats come
    after its last output)."""
    deadline = time.monotonic() + 30
    while True:
        text = traffic.scrape(base_url)
        if sum(parse(text).values("vllm:num_requests_running")) == 0:
            return text
        assert time.monotonic() < deadline, "the engine did not report itself idle"
        time.sleep(0.05)


def byte_tokenizer_dir(path: Path) -> Path:
    """A directory vLLM's frontend reads the toy model's tokenizer from: its
    byte vocabulary (ids 0-255 are bytes, 256 is `<eos>`) as a Hugging Face
    byte-level tokenizer, a chat template, and the `config.json` fields it
    wants (the engine reads its own model directory)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # GPT-2's printable stand-ins for the bytes, as byte-level tokenizers spell them.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]  # fmt: skip
    others = [b for b in range(256) if b not in printable]
    spelled = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    tokenizer = Tokenizer(models.BPE(vocab={spelled[b]: b for b in range(256)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<eos>"])
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "toy", "vocab_size": 257}))
    tokenizer.save(str(path / "tokenizer.json"))
    template = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "chat_template": template}))
    return path


def frontend_wrapper(directory: Path, binary: str, tokenizer_dir: Path) -> Path:
    """An executable that runs vLLM's frontend `binary` with `model_tag` set
    to `tokenizer_dir` in `--args-json` (serve names the model type there, for
    this project's built-in byte tokenizer; vLLM's frontend loads the
    tokenizer of `model_tag`). The inherited sockets pass through exec."""
    wrapper = directory / "vllm-frontend"
    wrapper.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "argv = sys.argv[1:]\n"
        "i = argv.index('--args-json') + 1\n"
        f"argv[i] = json.dumps({{**json.loads(argv[i]), 'model_tag': {str(tokenizer_dir)!r}}})\n"
        f"os.execv({binary!r}, [{binary!r}, *argv])\n"
    )
    wrapper.chmod(0o700)
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("frontend", help="vLLM 0.33's vllm-rs binary (site-packages/vllm/vllm-rs)")
    args = parser.parse_args()
    port = free_port()
    scratch = Path(tempfile.mkdtemp(prefix="vllm-rs-metrics-"))
    model_dir = Path(write_model_dir(str(scratch / "model"), "toy"))
    wrapper = frontend_wrapper(scratch, args.frontend, byte_tokenizer_dir(scratch / "tokenizer"))
    # Dev mode: vLLM's frontend serves /sleep and /wake_up (the traffic's last calls) only then.
    env = {**os.environ, "VLLM_RS_FRONTEND_PATH": str(wrapper), "VLLM_NO_USAGE_STATS": "1", "VLLM_SERVER_DEV_MODE": "1"}
    command = [sys.executable, "-m", "vllm_rs", "serve", "--model", str(model_dir), "--served-model-name", traffic.MODEL, "--host", "127.0.0.1", "--port", str(port), "--frontend", "rust",
               *traffic.CACHE_ARGS]  # fmt: skip
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url, proc)
        seen = traffic.drive(base_url, n=1)
        text = idle_metrics(base_url)
    finally:
        os.killpg(proc.pid, 2)
        proc.wait(60)
        shutil.rmtree(scratch)
    families = {name: family.describe() for name, family in sorted(parse(text).families.items())}
    OUT.write_text(
        json.dumps(
            {
                "source": "GET /metrics of vLLM 0.33.0's bundled frontend (site-packages/vllm/vllm-rs) in front of "
                "this project's reference engine (toy model with a byte-level tokenizer, 8 KV blocks of 16 "
                "tokens), after the traffic of "
                "tests/support/metrics_traffic.py; written by scripts/make_metrics_fixture.py",
                "traffic": seen,
                "families": families,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"{len(families)} families -> {OUT}")


if __name__ == "__main__":
    main()
