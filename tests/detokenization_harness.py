"""What the detokenization tests share: the frontend (the real `vllm-rs`
binary) serving a Hugging Face tokenizer from a model directory, an engine the test plays over real ZeroMQ sockets that
emits chosen token ids one per step, and the `openai` client asking for the
same completion streamed and not. No tests live here."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from tests.support.engine_peer import ScriptedEngine
from tests.support.frontend_stack import engine_listeners, rust_frontend
from tests.support.http import in_background
from tests.support.wait import DEADLINE_S, wait_until

FINISH_STOP, FINISH_LENGTH = 0, 1


@dataclass
class Served:
    """A frontend on a loopback port with engine 0 played by the test."""

    port: int
    input_address: str
    output_address: str
    engine: ScriptedEngine | None = None

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0, timeout=60)

    def wait_ready(self, alive: Any) -> None:
        """Returns once `/v1/models` answers; `alive()` says the process still runs."""

        def serving() -> bool:
            try:
                self.client().models.list()
                return True
            except openai.APIConnectionError:
                assert alive(), "the frontend exited during start-up"
                return False

        wait_until(serving, "the frontend to serve")


@contextlib.contextmanager
def serve(model_dir: Path) -> Iterator[Served]:
    """The frontend serving the tokenizer in `model_dir`, engine 0 played by the test."""
    listeners = engine_listeners()
    namespace = argparse.Namespace(model="toy", tokenizer=str(model_dir))
    with rust_frontend(namespace, listeners) as frontend:
        served = Served(frontend.port, listeners.input.address, listeners.output.address)
        try:
            served.engine = ScriptedEngine(served)
            served.wait_ready(frontend.process.is_alive)
            yield served
        finally:
            if served.engine is not None:
                served.engine.close()


@dataclass
class Answer:
    """One completion asked for twice, streamed and not."""

    prompt_ids: list[int]
    streamed: str
    pieces: list[str]
    text: str
    finish_reason: str
    stop_reason: Any


def complete(
    served: Served,
    prompt: str | list[int] | list[dict[str, str]],
    outputs: list[int],
    finish: int | None = FINISH_LENGTH,
    stop_reason: Any = None,
    **params: Any,
) -> Answer:
    """Asks `served` for a completion of `prompt` (chat messages when it is a
    list of dicts) streamed, then not, while the engine answers each with
    `outputs`, one id per step, the last one finishing with `finish`. With
    `finish` None the engine never finishes: a stop string must end the
    request, and its ABORT must reach the engine. Returns what both gave."""
    client = served.client()
    model = client.models.list().data[0].id
    chat = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)
    body: dict[str, Any] = {"model": model, "max_tokens": len(outputs), "extra_body": params}
    create = client.chat.completions.create if chat else client.completions.create
    body["messages" if chat else "prompt"] = prompt

    results = []
    prompt_ids: list[int] = []
    for stream in (True, False):
        future = in_background(lambda stream=stream: list(create(stream=True, **body)) if stream else create(**body))
        request_id, prompt_ids, _sampling = served.engine.next_add()
        for index, token_id in enumerate(outputs):
            last = index == len(outputs) - 1
            served.engine.send_outputs(
                [[request_id, [token_id], None, None, None, finish if last else None, stop_reason if last else None]]
            )
        results.append(future.result(timeout=DEADLINE_S))
        if finish is None:
            served.engine.wait_for_abort(request_id)
    chunks, completion = results
    choices = [c.choices[0] for c in chunks if c.choices]
    pieces = [(c.delta.content or "") if chat else c.text for c in choices]
    choice = completion.choices[0]
    streamed_finish = [c.finish_reason for c in choices if c.finish_reason]
    assert streamed_finish == [choice.finish_reason], (streamed_finish, choice.finish_reason)
    stop = (choice.model_extra or {}).get("stop_reason")
    text = choice.message.content if chat else choice.text
    return Answer(prompt_ids, "".join(pieces), pieces, text, choice.finish_reason, stop)
