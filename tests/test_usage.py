"""Tests for vllm_rs.usage: real files, a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import enum
import http.server
import importlib.metadata
import json
import os
import socket
import threading
import types

import pytest
from vllm_rs import usage
from vllm_rs.usage import (
    USAGE_STATS_KEYS,
    UsageContext,
    get_config_root,
    is_usage_stats_enabled,
    report_usage_stats,
)

OPT_OUTS = ("VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK", "DO_NOT_TRACK")
JOIN_S = 30  # generous bound for a loaded machine; not a timing assertion

SEED_KEYS = {
    "dtype",
    "block_size",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "quantization",
    "kv_cache_dtype",
    "enable_lora",
    "enable_prefix_caching",
    "enforce_eager",
    "disable_custom_all_reduce",
    "tensor_parallel_size",
    "data_parallel_size",
    "pipeline_parallel_size",
    "enable_expert_parallel",
    "all2all_backend",
    "kv_connector",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "attention_backend",
    "compilation_mode",
    "spec_decode_method",
    "num_speculative_tokens",
    "enable_eplb",
    "num_redundant_experts",
    "num_experts",
}


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A fresh config root, usage stats enabled, no server configured."""
    for name in OPT_OUTS + ("VLLM_USAGE_STATS_SERVER", "VLLM_USAGE_SOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_CONFIG_ROOT", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


@pytest.fixture
def thread_errors(monkeypatch):
    """Exceptions that escape any thread during the test."""
    errors = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    return errors


def _lines(root):
    path = root / "usage_stats.json"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _join(thread):
    assert isinstance(thread, threading.Thread) and thread.daemon
    thread.join(JOIN_S)
    assert not thread.is_alive()


class _Mode(enum.IntEnum):
    VLLM_COMPILE = 3


def _full_config():
    ns = types.SimpleNamespace
    model = ns(
        dtype="torch.bfloat16",
        quantization="fp8",
        enforce_eager=False,
        max_model_len=8192,
        architecture="LlamaForCausalLM",
        architectures=["LlamaForCausalLM"],
        using_transformers_backend=lambda: False,
        get_num_experts=lambda: 0,
    )
    return ns(
        model_config=model,
        cache_config=ns(
            block_size=16,
            gpu_memory_utilization=0.9,
            kv_cache_memory_bytes=None,
            cache_dtype="auto",
            enable_prefix_caching=True,
        ),
        parallel_config=ns(
            disable_custom_all_reduce=False,
            tensor_parallel_size=2,
            data_parallel_size=1,
            pipeline_parallel_size=1,
            enable_expert_parallel=False,
            all2all_backend="naive",
            enable_eplb=False,
            eplb_config=ns(num_redundant_experts=0),
        ),
        scheduler_config=ns(max_num_seqs=256, max_num_batched_tokens=2048),
        attention_config=ns(backend=None),
        compilation_config=ns(mode=_Mode.VLLM_COMPILE),
        speculative_config=ns(method="eagle", num_speculative_tokens=3),
        kv_transfer_config=ns(kv_connector="NixlConnector"),
        lora_config=None,
    )


# ---------------------------------------------------------------- opt-outs


@pytest.mark.parametrize("name", OPT_OUTS)
def test_env_opt_outs_disable_reporting(root, monkeypatch, name):
    assert is_usage_stats_enabled()
    monkeypatch.setenv(name, "1")
    assert not is_usage_stats_enabled()
    assert report_usage_stats(_full_config()) is None
    assert not (root / "usage_stats.json").exists()


def test_do_not_track_file_disables_reporting(root):
    root.mkdir(parents=True)
    (root / "do_not_track").touch()
    assert not is_usage_stats_enabled()
    assert report_usage_stats(_full_config()) is None
    assert not (root / "usage_stats.json").exists()


def test_opt_out_value_zero_keeps_reporting(root, monkeypatch):
    monkeypatch.setenv("DO_NOT_TRACK", "0")
    assert is_usage_stats_enabled()


def test_config_root_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CONFIG_ROOT", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert get_config_root() == tmp_path / "xdg" / "vllm"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert get_config_root() == tmp_path / ".config" / "vllm"


# ---------------------------------------------------------------- the record


def test_usage_context_values():
    assert [c.value for c in UsageContext] == [
        "UNKNOWN_CONTEXT",
        "LLM_CLASS",
        "API_SERVER",
        "OPENAI_API_SERVER",
        "OPENAI_BATCH_RUNNER",
        "ENGINE_CONTEXT",
    ]
    assert UsageContext.LLM_CLASS == "LLM_CLASS"


def test_report_appends_one_json_line_with_config_and_platform(root, thread_errors):
    assert set(USAGE_STATS_KEYS) == SEED_KEYS
    _join(report_usage_stats(_full_config()))
    [rec] = _lines(root)
    assert rec["context"] == "ENGINE_CONTEXT"
    assert rec["model_architecture"] == "LlamaForCausalLM"
    expected = {
        "dtype": "torch.bfloat16",
        "block_size": 16,
        "gpu_memory_utilization": 0.9,
        "kv_cache_memory_bytes": None,
        "quantization": "fp8",
        "kv_cache_dtype": "auto",
        "enable_lora": False,
        "enable_prefix_caching": True,
        "enforce_eager": False,
        "disable_custom_all_reduce": False,
        "tensor_parallel_size": 2,
        "data_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "enable_expert_parallel": False,
        "all2all_backend": "naive",
        "kv_connector": "NixlConnector",
        "max_model_len": 8192,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 2048,
        "attention_backend": None,
        "compilation_mode": "VLLM_COMPILE",
        "spec_decode_method": "eagle",
        "num_speculative_tokens": 3,
        "enable_eplb": False,
        "num_redundant_experts": 0,
        "num_experts": 0,
    }
    assert {k: rec[k] for k in SEED_KEYS} == expected
    # Platform facts.
    assert rec["os"] == "Linux"
    assert rec["python_version"].count(".") == 2
    assert rec["num_cpu"] == os.cpu_count()
    assert rec["total_memory"] > 0
    assert rec["cpu_type"]
    assert rec["torch_version"] == importlib.metadata.version("torch")
    assert isinstance(rec["gpu_count"], int) and rec["gpu_count"] >= 0
    assert (rec["gpu_type"] is None) == (rec["gpu_count"] == 0)
    assert thread_errors == []

    _join(report_usage_stats(_full_config(), UsageContext.LLM_CLASS))
    first, second = _lines(root)
    assert second["context"] == "LLM_CLASS" and first == rec
    assert second["uuid"] == first["uuid"]


def test_config_missing_everything_gives_nulls(root, thread_errors):
    thread = report_usage_stats(object())
    _join(thread)
    [rec] = _lines(root)
    assert all(rec[k] is None for k in SEED_KEYS)
    assert rec["model_architecture"] is None
    assert thread_errors == []


def test_config_partial_and_raising_attributes(root, thread_errors):
    class Exploding:
        @property
        def block_size(self):
            raise RuntimeError("boom")

        gpu_memory_utilization = float("nan")

    cfg = types.SimpleNamespace(
        model_config=types.SimpleNamespace(dtype="torch.float16", architectures=["X"]),
        cache_config=Exploding(),
        lora_config=object(),
        speculative_config=None,
        kv_transfer_config=None,
    )
    _join(report_usage_stats(cfg, "custom"))
    [rec] = _lines(root)
    assert rec["dtype"] == "torch.float16"
    assert rec["model_architecture"] == "X"
    assert rec["enable_lora"] is True
    assert rec["block_size"] is None and rec["gpu_memory_utilization"] is None
    assert rec["spec_decode_method"] is None and rec["kv_connector"] is None
    assert rec["max_model_len"] is None and rec["num_experts"] is None
    assert rec["context"] == "custom"
    assert thread_errors == []


def test_unwritable_config_root_never_breaks_caller(root, thread_errors):
    root.parent.mkdir(parents=True, exist_ok=True)
    root.write_text("a file where the config directory should be")
    _join(report_usage_stats(_full_config()))
    assert thread_errors == []


# ---------------------------------------------------------------- POST


class _Server:
    """A real HTTP server on 127.0.0.1 that records POST bodies; with
    `hold`, each request waits until `release` is set."""

    def __init__(self, hold=False):
        self.bodies = []
        self.entered = threading.Event()
        self.release = threading.Event()
        if not hold:
            self.release.set()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.bodies.append((self.headers["Content-Type"], body))
                outer.entered.set()
                outer.release.wait(JOIN_S)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/usage"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(JOIN_S)


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


@pytest.fixture
def slow_server():
    s = _Server(hold=True)
    yield s
    s.close()


def test_post_sends_the_same_record(root, monkeypatch, server, thread_errors):
    monkeypatch.setenv("VLLM_USAGE_STATS_SERVER", server.url)
    _join(report_usage_stats(_full_config(), UsageContext.OPENAI_API_SERVER))
    [(content_type, body)] = server.bodies
    assert content_type == "application/json"
    posted = json.loads(body)
    assert posted == _lines(root)[0]
    assert posted["context"] == "OPENAI_API_SERVER"
    assert thread_errors == []


def test_no_post_without_server_setting(root, server):
    _join(report_usage_stats(_full_config()))
    assert len(_lines(root)) == 1
    assert server.bodies == []


def test_slow_server_does_not_block_caller(root, monkeypatch, slow_server, thread_errors):
    monkeypatch.setenv("VLLM_USAGE_STATS_SERVER", slow_server.url)
    thread = report_usage_stats(_full_config())
    # The caller is back while the server still holds the request.
    assert slow_server.entered.wait(JOIN_S)
    assert not slow_server.release.is_set()
    assert thread.is_alive()
    # The file line was written before the POST.
    assert len(_lines(root)) == 1
    slow_server.release.set()
    _join(thread)
    assert len(slow_server.bodies) == 1
    assert thread_errors == []


def test_server_down_never_breaks_caller(root, monkeypatch, thread_errors, caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("VLLM_USAGE_STATS_SERVER", f"http://127.0.0.1:{port}/")
    with caplog.at_level("DEBUG", logger="vllm_rs.usage"):
        _join(report_usage_stats(_full_config()))
    assert len(_lines(root)) == 1
    assert thread_errors == []
    assert any("Could not send usage stats" in r.getMessage() for r in caplog.records)


def test_thread_start_failure_never_breaks_caller(root, monkeypatch):
    def fail(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(usage.threading.Thread, "start", fail)
    assert report_usage_stats(_full_config()) is None


def test_usage_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, vllm_rs.usage; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
