"""Model files downloaded from the hub as vLLM does when the cache lacks
them (by rust/model-files with `hf-hub`, through `vllm_rs._core`, as the
frontend downloads them), against a local stand-in for the Hugging Face
Hub (`tests/fake_hub.py`, pointed to by `HF_ENDPOINT`), never the internet:
`serve --model Org/Name` with an empty `HF_HOME` downloads the config and
tokenizer files into the cache layout and serves with them;
`HF_HUB_OFFLINE` and a repo the hub lacks exit 2 naming the model and where
it looked. The built-in models (`toy`, `echo`) never reach the hub: `serve`
opens no connection to `HF_ENDPOINT` and logs no hub access for them."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from vllm_rs.engine.model_loader.registry import write_model_dir
from vllm_rs.model_files import ModelNotFoundError, locate_model

from tests.fake_hub import COMMIT, FakeHub
from tests.test_serve import Serve, needs_frontend


def hub_files(root: Path) -> Path:
    """`Org/Name` on the fake hub: an echo model whose generation config adds
    EOS id 10 (a newline)."""
    repo = root / "Org" / "Name"
    write_model_dir(str(repo), "echo")
    (repo / "generation_config.json").write_text(json.dumps({"eos_token_id": [256, 10]}))
    return root


def hub_env(home: Path, hub: FakeHub, **extra: str) -> dict[str, str]:
    return {"HF_HOME": str(home), "HF_HUB_CACHE": "", "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "", **extra}


def test_locate_model_downloads_what_the_cache_lacks_into_the_cache_layout(tmp_path):
    with FakeHub(hub_files(tmp_path / "files")) as hub:
        env = hub_env(tmp_path / "home", hub)
        snapshot = Path(locate_model("Org/Name", env=env))
        repo = tmp_path / "home" / "hub" / "models--Org--Name"
        assert snapshot == repo / "snapshots" / COMMIT
        assert (repo / "refs" / "main").read_text().strip() == COMMIT
        for file in ("config.json", "generation_config.json"):
            assert (snapshot / file).read_bytes() == (tmp_path / "files" / "Org" / "Name" / file).read_bytes()
            assert "blobs" in os.readlink(snapshot / file)
        assert not (snapshot / "tokenizer.json").exists(), "a file the hub lacks is skipped"
        asked = len(hub.requests)
        assert locate_model("Org/Name", env=env) == str(snapshot)
        assert len(hub.requests) == asked, "a cached model is not asked for again"
        with pytest.raises(ModelNotFoundError, match="has no such model") as missing:
            locate_model("Org/Missing", env=env)
        assert "Org/Missing" in str(missing.value) and hub.url in str(missing.value)
        asked = len(hub.requests)
        offline = hub_env(tmp_path / "empty", hub, HF_HUB_OFFLINE="1")
        with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE") as refused:
            locate_model("Org/Name", env=offline)
        assert str(tmp_path / "empty" / "hub" / "models--Org--Name") in str(refused.value)
        assert len(hub.requests) == asked, "offline asks the hub nothing"
    with pytest.raises(ModelNotFoundError, match="failed"):
        locate_model("Org/Name", env={**env, "HF_HOME": str(tmp_path / "other"), "HF_ENDPOINT": "http://127.0.0.1:1"})


@needs_frontend
def test_serve_downloads_a_hub_model_and_serves_it(tmp_path):
    with FakeHub(hub_files(tmp_path / "files")) as hub:
        serve = Serve("--model", "Org/Name", "--port", "0", env=hub_env(tmp_path / "home", hub))
        try:
            client = serve.client()
            choice = client.completions.create(model="Org/Name", prompt="ab\ncd", max_tokens=12).choices[0]
            assert (choice.text, choice.finish_reason) == ("ab", "stop"), serve.output
            serve.interrupt()
            assert serve.wait(30) == 0
        finally:
            serve.kill()
        assert (tmp_path / "home" / "hub" / "models--Org--Name" / "snapshots" / COMMIT / "config.json").is_file()


@needs_frontend
def test_serve_exits_2_offline_or_for_a_repo_the_hub_lacks(tmp_path):
    with FakeHub(hub_files(tmp_path / "files")) as hub:
        for model, extra, needle in [
            ("Org/Name", {"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE"),
            ("Org/Missing", {}, "has no such model"),
        ]:
            home = tmp_path / f"home-{model.replace('/', '-')}"
            serve = Serve("--model", model, "--port", "0", env=hub_env(home, hub, **extra))
            try:
                assert serve.wait(60) == 2, serve.output
                assert model in serve.output and needle in serve.output, serve.output
                assert str(home / "hub" / f"models--{model.replace('/', '--')}") in serve.output, serve.output
                assert "Traceback" not in serve.output, serve.output
            finally:
                serve.kill()


def assert_never_connected(hub: socket.socket) -> None:
    """`hub` (listening, non-blocking) has no connection waiting: the kernel
    completes a connect into the backlog even though nobody accepts."""
    with pytest.raises(BlockingIOError):
        hub.accept()


def test_locate_model_refuses_built_in_names_without_asking_anyone(tmp_path, monkeypatch):
    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        hub.listen()
        hub.setblocking(False)
        # Even a cached repo of that name is not looked at.
        cached = tmp_path / "hub" / "models--toy"
        (cached / "refs").mkdir(parents=True)
        (cached / "refs" / "main").write_text(COMMIT)
        (cached / "snapshots" / COMMIT).mkdir(parents=True)
        env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": f"http://127.0.0.1:{hub.getsockname()[1]}"}
        for name in ("toy", "echo"):
            with pytest.raises(ModelNotFoundError, match="built-in model") as e:
                locate_model(name, env=env)
            assert repr(name) in str(e.value) and "nothing was downloaded" in str(e.value)
        assert_never_connected(hub)
    # A directory of that name is still a directory.
    (tmp_path / "toy").mkdir()
    monkeypatch.chdir(tmp_path)
    assert locate_model("toy", env=env) == "toy"


@needs_frontend
@pytest.mark.parametrize("model", ["echo", "toy"])
def test_built_in_models_never_reach_the_hub(tmp_path, model):
    with socket.socket() as hub:
        # A hub that would see any attempt: HF_ENDPOINT points here, online.
        hub.bind(("127.0.0.1", 0))
        hub.listen()
        hub.setblocking(False)
        endpoint = f"http://127.0.0.1:{hub.getsockname()[1]}"
        env = {
            "HF_HOME": str(tmp_path / "home"),
            "HF_HUB_CACHE": "",
            "HF_ENDPOINT": endpoint,
            "HF_HUB_OFFLINE": "",
            # A proxy would take the connection elsewhere and hide an attempt.
            **{name: "" for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")},
        }
        serve = Serve("--model", model, "--port", "0", env=env)  # the Rust frontend, the default
        try:
            choice = serve.client().completions.create(model=model, prompt="ab", max_tokens=2).choices[0]
            assert choice.finish_reason == "length", serve.output
            # The frontend has loaded its tokenizer and generation config by now.
            assert_never_connected(hub)
            serve.interrupt()
            assert serve.wait(30) == 0, serve.output
        finally:
            serve.kill()
        assert_never_connected(hub)
    for needle in ("downloading", "huggingface", endpoint, "Hugging Face cache"):
        assert needle not in serve.output, serve.output
    assert not (tmp_path / "home").exists(), "nothing was written to the hub cache"


def test_locate_model_with_weights_fetches_the_safetensors_too(tmp_path):
    files = tmp_path / "files"
    single, sharded = files / "Org" / "Single", files / "Org" / "Sharded"
    for repo in (single, sharded):
        repo.mkdir(parents=True)
        (repo / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (single / "model.safetensors").write_bytes(b"weights")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    for shard in set(index["weight_map"].values()):
        (sharded / shard).write_bytes(shard.encode())
    with FakeHub(files) as hub:
        env = hub_env(tmp_path / "home", hub)
        # What the frontend fetched first: config and tokenizer files only.
        tokenizer_only = Path(locate_model("Org/Single", env=env))
        assert not (tokenizer_only / "model.safetensors").exists()
        offline = {**env, "HF_HUB_OFFLINE": "1"}
        with pytest.raises(ModelNotFoundError, match="lacks its weights .*HF_HUB_OFFLINE"):
            locate_model("Org/Single", env=offline, weights=True)
        snapshot = Path(locate_model("Org/Single", env=env, weights=True))
        assert (snapshot / "model.safetensors").read_bytes() == b"weights"
        assert locate_model("Org/Single", env=offline, weights=True) == str(snapshot), "cached weights need no hub"
        snapshot = Path(locate_model("Org/Sharded", env=env, weights=True))
        assert sorted(p.name for p in snapshot.glob("*.safetensors")) == sorted(set(index["weight_map"].values()))
        (files / "Org" / "Bare").mkdir()
        (files / "Org" / "Bare" / "config.json").write_text(json.dumps({"model_type": "llama"}))
        with pytest.raises(ModelNotFoundError, match="neither model.safetensors nor model.safetensors.index.json"):
            locate_model("Org/Bare", env=env, weights=True)
