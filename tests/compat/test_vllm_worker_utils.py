"""vLLM 0.33's own `bind_kv_cache` (`vllm.v1.worker.utils`) and host/port
helpers (`vllm.utils.network_utils`) against this project's, on the same
inputs. The layers are vLLM's real `Attention` modules (CPU platform, a tiny
model config written into a temporary folder, nothing downloaded): bound by
vLLM and by `vllm_rs.utils.bind_kv_cache`, they must hold the same tensors
and the runners' lists must be the same tensors in the same order. The host
and ZeroMQ path helpers must return what vLLM's return, and raise the
exception class vLLM raises, except where this project deliberately refuses
more (listed in `STRICTER`, and in docs/utils-api.md)."""

from __future__ import annotations

import json

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")

import torch  # noqa: E402
import vllm.utils.network_utils as vllm_net  # noqa: E402
from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers.attention import Attention  # noqa: E402
from vllm.v1.worker.utils import bind_kv_cache as vllm_bind_kv_cache  # noqa: E402
from vllm_rs import network_utils  # noqa: E402
from vllm_rs.utils import bind_kv_cache  # noqa: E402

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 257,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


@pytest.fixture(scope="module")
def model_config(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return ModelConfig(model=str(folder), skip_tokenizer_init=True, dtype="float32")


def attention_layers(model_config, names):
    """vLLM `Attention` layers named `names`, each set in its own config (a
    config refuses two layers of one name)."""
    config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(config):
        return {name: Attention(4, 16, 0.25, prefix=name) for name in names}


SCENARIOS = {
    "plain": (["layers.0.self_attn", "layers.1.self_attn", "layers.2.self_attn", "layers.3.self_attn"], {}),
    "jamba_pp": (["model.layers.28.attn", "model.layers.20.attn"], {}),
    "draft_model": (
        ["model.layers.0.attn", "model.layers.1.attn", "draft_model.layers.0.attn", "draft_model.layers.1.attn"],
        {},
    ),
    "encoder_decoder": (
        ["decoder.layers.1.encoder_attn", "decoder.layers.0.self_attn", "decoder.layers.1.self_attn"],
        {},
    ),
    "num_attn_module": (
        ["model.layers.1.attn.0", "model.layers.0.attn.1", "model.layers.0.attn.0", "model.layers.1.attn.1"],
        {"num_attn_module": 2},
    ),
}


@pytest.mark.parametrize("with_views", [False, True], ids=["caches", "views"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_bind_kv_cache_binds_as_vllm_does(model_config, scenario, with_views):
    names, kwargs = SCENARIOS[scenario]
    kv_caches = {name: torch.full((2, 4), float(i)) for i, name in enumerate(names)}
    if with_views:
        kwargs = {**kwargs, "layer_kv_caches": {name: t.view(4, 2) for name, t in kv_caches.items()}}
        kwargs["kv_cache_groups"] = [type("Group", (), {"layer_names": list(names)})()]
    theirs, ours = attention_layers(model_config, names), attention_layers(model_config, names)
    their_runner: list = []
    our_runner: list = []
    vllm_bind_kv_cache(kv_caches, theirs, their_runner, **kwargs)
    bind_kv_cache(kv_caches, ours, our_runner, **kwargs)
    assert len(our_runner) == len(their_runner) == len(names)
    assert all(a is b for a, b in zip(our_runner, their_runner, strict=True))
    for name in names:
        assert isinstance(ours[name].kv_cache, torch.Tensor)
        assert ours[name].kv_cache is theirs[name].kv_cache


HOST_PORTS = [
    "127.0.0.1:5555",
    "localhost:0",
    "[::1]:5555",
    "[2001:db8::7]:65535",
    "127.0.0.1::5555",
    "127.0.0.1:5555:",
    "127.0.0.15555",
    "127.0.0.1:5555a",
    "127.0.0.1:",
    "::1:5555",
    "[::1]::5555",
    "[::1]5555",
    "[::1]:5555a",
    "[::1]:",
]
#: Accepted by vLLM, refused here with a ValueError naming the problem.
STRICTER = [":5555", "[]:5555", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1: 80", "127.0.0.1:+80"]


def outcome(fn, *args):
    try:
        return ("value", fn(*args))
    except Exception as e:  # noqa: BLE001 (the class is what is compared)
        return ("raised", e)


def assert_answers_as_vllm(ours, theirs, arg):
    """`ours(arg)` returns what `theirs(arg)` returns, or raises its class."""
    kind, expected = outcome(theirs, arg)
    if kind == "value":
        assert ours(arg) == expected
    else:
        with pytest.raises(type(expected)):
            ours(arg)


@pytest.mark.parametrize("text", HOST_PORTS)
def test_split_host_port_answers_as_vllm(text):
    assert_answers_as_vllm(network_utils.split_host_port, vllm_net.split_host_port, text)


@pytest.mark.parametrize("text", STRICTER)
def test_split_host_port_refuses_what_vllm_lets_through(text):
    assert outcome(vllm_net.split_host_port, text)[0] == "value"
    with pytest.raises(ValueError, match="empty|0 to 65535"):
        network_utils.split_host_port(text)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "2001:db8::1", "fe80::1%eth0", "0.0.0.0", "::"])
@pytest.mark.parametrize("port", [0, 5555, "5555"])
def test_join_host_port_make_zmq_path_and_get_tcp_uri_answer_as_vllm(host, port):
    assert network_utils.join_host_port(host, port) == vllm_net.join_host_port(host, port)
    for scheme in ("tcp", "ipc"):
        assert network_utils.make_zmq_path(scheme, host, port) == vllm_net.make_zmq_path(scheme, host, port)
    assert network_utils.make_zmq_path("inproc", host) == vllm_net.make_zmq_path("inproc", host)
    assert network_utils.get_tcp_uri(host, port) == vllm_net.get_tcp_uri(host, port)


@pytest.mark.parametrize(
    "path",
    [
        "ipc://some_path",
        "tcp://127.0.0.1:5555",
        "tcp://[::1]:5555",
        "inproc://some_identifier",
        "invalid_path",
        "tcp://127.0.0.1",
        "tcp://[::1]",
        "tcp://:5555",
    ],
)
def test_split_zmq_path_answers_as_vllm(path):
    assert_answers_as_vllm(network_utils.split_zmq_path, vllm_net.split_zmq_path, path)
