"""Model files downloaded from the hub as vLLM does when the cache lacks
them, with `huggingface_hub`, against a local stand-in for the Hugging Face
Hub (`tests/fake_hub.py`, pointed to by `HF_ENDPOINT`), never the internet:
`serve --model Org/Name` with an empty `HF_HOME` downloads the config and
tokenizer files into the cache layout and serves with them;
`HF_HUB_OFFLINE` and a repo the hub lacks exit 2 naming the model
and where it looked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from vllm_rs.engine.models import write_model_dir
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
