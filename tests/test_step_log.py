"""The engine's opt-in step records (`VLLM_RS_STEP_LOG`) and the benchmark's
summary of them (bench/engine_steps.py), on the echo engine."""

from __future__ import annotations

import json
import math
import os

import pytest
from vllm_rs.engine import make_engine_config
from vllm_rs.engine.core import EngineCore
from vllm_rs.engine.protocol import EngineCoreRequest
from vllm_rs.engine.step_log import STEP_LOG_ENV, StepLogError

from bench.engine_steps import decode_steps


def run_two_requests(core: EngineCore) -> None:
    core.add_request(EngineCoreRequest("a", list(b"xy"), {"max_tokens": 3}))
    core.add_request(EngineCoreRequest("b", list(b"xyz"), {"max_tokens": 3}))
    while core.has_work():
        core.step()


def test_every_step_that_ran_requests_is_recorded_and_summarized(tmp_path, monkeypatch):
    monkeypatch.setenv(STEP_LOG_ENV, str(tmp_path / "steps"))
    run_two_requests(EngineCore(make_engine_config("echo")))
    (log,) = (tmp_path / "steps").iterdir()
    assert log.name == f"engine-{os.getpid()}.jsonl"
    # Other local users can read neither the directory it made nor the records.
    assert (tmp_path / "steps").stat().st_mode & 0o777 == 0o700
    assert log.stat().st_mode & 0o777 == 0o600
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    # Both prompts (5 tokens) with their first samples, then two decode steps.
    assert [(s["requests"], s["tokens"]) for s in steps] == [(2, 5), (2, 2), (2, 2)]
    for before, step in zip([None, *steps], steps):
        assert step["start"] <= step["end"] and step["cpu"] >= 0 and step["cpu_wait"] >= 0
        assert before is None or before["end"] <= step["start"]
    summary = decode_steps(tmp_path / "steps", steps[0]["start"], steps[-1]["end"], batch=2)
    assert summary["steps"] == 2
    assert summary["between_ms"] == pytest.approx((steps[2]["start"] - steps[1]["end"]) * 1000)
    # Outside the window, or at another batch size, there is nothing to summarize.
    assert decode_steps(tmp_path / "steps", steps[-1]["end"], math.inf, batch=2) is None
    assert decode_steps(tmp_path / "steps", 0, math.inf, batch=3) is None


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(STEP_LOG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    run_two_requests(EngineCore(make_engine_config("echo")))
    assert list(tmp_path.iterdir()) == []


def test_a_link_in_place_of_the_log_is_refused_not_followed(tmp_path, monkeypatch):
    (tmp_path / "steps").mkdir()
    target = tmp_path / "elsewhere"
    (tmp_path / "steps" / f"engine-{os.getpid()}.jsonl").symlink_to(target)
    monkeypatch.setenv(STEP_LOG_ENV, str(tmp_path / "steps"))
    with pytest.raises(StepLogError, match=STEP_LOG_ENV):
        EngineCore(make_engine_config("echo"))
    assert not target.exists()


def test_a_directory_that_cannot_be_written_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(STEP_LOG_ENV, str(tmp_path / "file" / "steps"))
    with pytest.raises(StepLogError, match=STEP_LOG_ENV):
        EngineCore(make_engine_config("echo"))
