"""The model's generation config and its files as vLLM 0.33 finds them, in
`serve` (which refuses a bad one before anything starts; the frontend's own
tests, frontend-bin/tests/generation_config.rs, check the sampling params
against vLLM's): an extra EOS id of the generation config finishes a request
in the real echo engine, and a hub model id is served from a Hugging Face
cache laid out on disk (no network)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from vllm_rs.engine.model_loader.registry import write_model_dir
from vllm_rs.generation_config import GenerationConfig, GenerationConfigError
from vllm_rs.model_files import ModelNotFoundError, hub_cache_roots, locate_model

from tests.test_serve import Serve, needs_frontend

#: The built-in byte-level tokenizer's EOS, and the newline the tests use as an end-of-turn id.
EOS, NEWLINE = 256, 10


def echo_model(path: Path, generation: dict[str, Any] | None) -> str:
    """An echo model folder with `generation` as its generation_config.json."""
    write_model_dir(str(path), "echo")
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    return str(path)


@needs_frontend
def test_an_extra_eos_id_of_the_generation_config_finishes_the_request(tmp_path):
    body = {"prompt": "ab\ncd", "max_tokens": 12}
    answers = []
    for name, generation in (("with", {"eos_token_id": [EOS, NEWLINE]}), ("without", None)):
        model = echo_model(tmp_path / name, generation)
        serve = Serve("--model", model, "--served-model-name", "echo", "--port", "0")
        try:
            status, raw = serve.http("POST", "/v1/completions", {"model": "echo", **body})
            assert status == 200, raw
            answers.append(json.loads(raw)["choices"][0])
        finally:
            serve.kill()
    with_eot, without = answers
    # The echo engine stops as vLLM's does (stop_token_ids, EOS), so the request carried 10.
    assert (with_eot["text"], with_eot["finish_reason"], with_eot["stop_reason"]) == ("ab", "stop", NEWLINE)
    assert without["finish_reason"] == "length", without


def test_generation_config_reading_and_errors(tmp_path):
    model = echo_model(tmp_path / "m", {"eos_token_id": [EOS, NEWLINE], "temperature": 0.6, "top_k": 20, "min_p": None})
    config = GenerationConfig.load("auto", {"temperature": None, "max_new_tokens": 5}, model)
    assert (config.defaults, config.max_tokens_cap, config.eos_token_ids) == (
        {"top_k": 20, "max_tokens": 5},
        5,
        [EOS, NEWLINE],
    )
    assert GenerationConfig.load("vllm", {}, model).defaults == {}
    assert GenerationConfig.load("vllm", {}, model).eos_token_ids == [EOS, NEWLINE]
    (tmp_path / "fallback").mkdir()
    (tmp_path / "fallback" / "config.json").write_text(
        json.dumps({"model_type": "x", "presence_penalty": 0.3, "text_config": {"temperature": 0.4, "eos_token_id": 5}})
    )
    fallback = GenerationConfig.load("auto", {}, str(tmp_path / "fallback"))
    assert (fallback.defaults, fallback.eos_token_ids) == ({"temperature": 0.4}, [5])
    for mode, overrides, needle in [
        ("auto", {"top_p": 2}, "override_generation_config.top_p"),
        ("auto", {"top_k": 1.5}, "top_k"),
        (str(tmp_path / "nowhere"), {}, "--generation-config"),
    ]:
        with pytest.raises(GenerationConfigError, match=needle):
            GenerationConfig.load(mode, overrides, model)
    Path(model, "generation_config.json").write_text("{")
    with pytest.raises(GenerationConfigError, match="not valid JSON"):
        GenerationConfig.load("auto", {}, model)


def fake_hub_cache(root: Path) -> Path:
    """`Org/Name` (an echo model) at `main` (extra EOS 10) and tag `v2` (extra EOS 11)."""
    repo = root / "hub" / "models--Org--Name"
    (repo / "refs").mkdir(parents=True)
    for ref, commit, extra in [("main", "1111aaaa", NEWLINE), ("v2", "2222bbbb", 11)]:
        (repo / "refs" / ref).write_text(commit)
        echo_model(repo / "snapshots" / commit, {"eos_token_id": [EOS, extra]})
    return root / "hub"


def test_locate_model_follows_refs_commits_and_the_cache_variables(tmp_path):
    hub = fake_hub_cache(tmp_path)
    # Offline: the cache only (tests/test_model_download.py downloads).
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    snapshots = hub / "models--Org--Name" / "snapshots"
    assert locate_model("Org/Name", env=env) == str(snapshots / "1111aaaa")
    assert locate_model("Org/Name", "v2", env=env) == str(snapshots / "2222bbbb")
    assert locate_model("Org/Name", "1111aaaa", env=env) == str(snapshots / "1111aaaa")
    assert locate_model("Org/Name", env={"HF_HUB_OFFLINE": "1"}, download_dir=str(hub)) == str(snapshots / "1111aaaa")
    assert hub_cache_roots({"HF_HOME": "/h"}) == ["/h/hub"]
    assert hub_cache_roots({"HOME": "/u"}, "/d") == ["/u/.cache/huggingface/hub", "/d"]
    for name, revision in [("Org/Missing", None), ("Org/Name", "v3"), ("../etc", None), ("Org/Name", "..")]:
        with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache"):
            locate_model(name, revision, env=env)


@needs_frontend
def test_serve_finds_a_hub_model_in_the_cache_at_its_revision(tmp_path):
    hub = fake_hub_cache(tmp_path)
    for revision, stop in [([], "\n"), (["--revision", "v2"], "\x0b")]:
        serve = Serve("--model", "Org/Name", *revision, "--port", "0", env={"HF_HUB_CACHE": str(hub)})
        try:
            client = serve.client()
            assert [m.id for m in client.models.list().data] == ["Org/Name"]
            choice = client.completions.create(model="Org/Name", prompt=f"ab{stop}cd", max_tokens=12).choices[0]
            assert (choice.text, choice.finish_reason) == ("ab", "stop"), serve.output
            serve.interrupt()
            assert serve.wait(30) == 0
        finally:
            serve.kill()


@needs_frontend
def test_serve_refuses_a_model_that_is_nowhere(tmp_path):
    hub = fake_hub_cache(tmp_path)
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    serve = Serve("--model", "Org/Missing", "--port", "0", env=env)
    try:
        assert serve.wait(60) == 2, serve.output
        assert "Org/Missing" in serve.output and str(hub / "models--Org--Missing") in serve.output, serve.output
    finally:
        serve.kill()
