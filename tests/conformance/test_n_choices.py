"""`n` > 1 end to end through `python -m vllm_rs serve`,
with the real `openai` client: n child requests as vLLM's `ParentRequest`
makes them, choices by `index` (whole, or interleaved when streamed, each
with its own finish), usage counting the prompt once, vLLM's validation,
and every child aborted when the client goes away. The echo model repeats
its prompt; the toy model samples (seeded per child)."""

from __future__ import annotations

import json

import pytest

from tests.conformance.support import API_KEY, AUTH
from tests.conformance.test_tools_reasoning import CALL_TEXT, WEATHER, _serve, echo_tools  # noqa: F401
from tests.test_serve import Serve


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _post(serve: Serve, path: str, body: dict) -> tuple[int, dict]:
    status, raw = serve.http("POST", path, body, AUTH)
    return status, json.loads(raw)


def test_n_choices(stack):
    client = stack.client()
    result = client.completions.create(model="echo", prompt="abc", max_tokens=4, n=3, seed=7)
    assert [(c.index, c.text, c.finish_reason) for c in result.choices] == [(i, "abca", "length") for i in range(3)]
    # The prompt counts once, the completions of every choice add up.
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (3, 12, 15)
    chat = client.chat.completions.create(model="echo", messages=_user("x"), max_tokens=2, n=2)
    assert [(c.index, c.message.role, c.message.content) for c in chat.choices] == [
        (0, "assistant", "us"),
        (1, "assistant", "us"),
    ]
    assert (chat.usage.completion_tokens, chat.usage.total_tokens) == (4, chat.usage.prompt_tokens + 4)


def test_each_choice_carries_its_own_logprobs_and_echo(stack):
    client = stack.client()
    result = client.completions.create(model="echo", prompt="ab", max_tokens=3, n=2, logprobs=1, echo=True)
    for choice in result.choices:
        assert choice.text == "ababa" and choice.logprobs.tokens == list("ababa"), choice
        assert choice.logprobs.text_offset == [0, 1, 2, 3, 4] and choice.logprobs.token_logprobs[0] is None
    streamed = client.completions.create(model="echo", prompt="ab", max_tokens=3, n=2, logprobs=1, stream=True)
    tokens: dict[int, list[str]] = {0: [], 1: []}
    for chunk in streamed:
        for choice in chunk.choices:
            tokens[choice.index] += choice.logprobs.tokens if choice.logprobs else []
    assert tokens == {0: list("aba"), 1: list("aba")}
    chat = client.chat.completions.create(model="echo", messages=_user("x"), max_tokens=2, n=2, logprobs=True,
                                          top_logprobs=1)  # fmt: skip
    for choice in chat.choices:
        assert [entry.token for entry in choice.logprobs.content] == ["u", "s"], choice
        assert all(len(entry.top_logprobs) == 1 for entry in choice.logprobs.content)


def test_n_choices_each_match_their_stop_string(stack):
    result = stack.client().completions.create(model="echo", prompt="hello", max_tokens=8, n=2, stop=["ll"])
    assert [(c.text, c.finish_reason, c.model_extra["stop_reason"]) for c in result.choices] == [
        ("he", "stop", "ll")
    ] * 2


def test_streamed_n_choices(stack):
    client = stack.client()
    chunks = list(
        client.completions.create(
            model="echo", prompt="hey", max_tokens=5, n=3, stream=True, stream_options={"include_usage": True}
        )
    )
    texts: dict[int, str] = {}
    finishes: dict[int, list[str]] = {}
    for chunk in chunks[:-1]:
        assert chunk.usage is None
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason is not None:
                finishes.setdefault(choice.index, []).append(choice.finish_reason)
    assert texts == {0: "heyhe", 1: "heyhe", 2: "heyhe"}
    assert finishes == {0: ["length"], 1: ["length"], 2: ["length"]}
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (3, 15)


def test_streamed_chat_n_choices(stack):
    chunks = list(
        stack.client().chat.completions.create(
            model="echo", messages=_user("x"), max_tokens=3, n=2, stream=True, stream_options={"include_usage": True}
        )
    )
    # One role chunk per choice, first.
    assert [(c.choices[0].index, c.choices[0].delta.role, c.choices[0].delta.content) for c in chunks[:2]] == [
        (0, "assistant", ""),
        (1, "assistant", ""),
    ]
    content = {
        i: "".join(c.choices[0].delta.content or "" for c in chunks[2:-1] if c.choices[0].index == i) for i in (0, 1)
    }
    assert content == {0: "use", 1: "use"}
    finishes = [(c.choices[0].index, c.choices[0].finish_reason) for c in chunks[2:-1] if c.choices[0].finish_reason]
    assert sorted(finishes) == [(0, "length"), (1, "length")]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_n_validation(stack):
    status, answer = _post(stack, "/v1/completions", {"model": "echo", "prompt": "a", "n": 0})
    assert status == 400 and answer["error"]["param"] == "n", answer
    assert answer["error"]["message"] == "n must be at least 1, got 0."
    for path, body in [
        ("/v1/completions", {"prompt": "a"}),
        ("/v1/chat/completions", {"messages": _user("a")}),
    ]:
        status, answer = _post(stack, path, {"model": "echo", "n": 2, "temperature": 0, **body})
        assert status == 400, answer
        assert answer["error"]["message"] == "n must be 1 when using greedy sampling, got 2."
    status, answer = _post(stack, "/v1/completions", {"model": "echo", "prompt": "a", "n": 2, "best_of": 2})
    assert status == 400 and answer["error"]["param"] == "best_of", answer


@pytest.fixture(scope="module")
def toy():
    """toy (random weights, sampled)."""
    yield from _serve("toy")


def test_seeded_choices_are_reproducible_yet_distinct(toy):
    client = toy.client()

    def texts(seed: int) -> list[str]:
        result = client.completions.create(model="toy", prompt="once", max_tokens=12, n=3, seed=seed, temperature=1)
        return [c.text for c in result.choices]

    first = texts(7)
    assert texts(7) == first
    assert len(set(first)) == 3, first  # each child samples with its own seed
    assert texts(8) != first


def test_chat_n_choices_parse_tools_and_reasoning_per_choice(echo_tools):  # noqa: F811
    client = echo_tools.client()
    kwargs = {"model": "echo", "messages": _user("</think>" + CALL_TEXT), "tools": [WEATHER],
              "stop": ["\nassistant"], "max_tokens": 400, "n": 2}  # fmt: skip
    result = client.chat.completions.create(**kwargs)
    assert [c.index for c in result.choices] == [0, 1]
    for choice in result.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.model_extra["reasoning"] == "user: "
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    for index in (0, 1):
        deltas = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert deltas[0].delta.role == "assistant"
        reasoning = "".join(d.delta.model_extra.get("reasoning") or "" for d in deltas)
        arguments = "".join(
            call.function.arguments or "" for d in deltas for call in d.delta.tool_calls or [] if call.function
        )
        assert reasoning == "user: " and json.loads(arguments) == {"city": "Paris"}
        assert [d.finish_reason for d in deltas if d.finish_reason] == ["tool_calls"]


def test_disconnect_mid_stream_aborts_every_choice():
    serve = Serve("--model", "echo", "--port", "0", "--enable-log-requests",
                  "--max-model-len", "1048576", env={"VLLM_API_KEY": API_KEY})  # fmt: skip
    try:
        client = serve.client()
        stream = client.completions.create(model="echo", prompt="go", max_tokens=500_000, n=3, stream=True)
        seen = set()
        for chunk in stream:
            seen.add(chunk.choices[0].index)
            if len(seen) == 3:
                break
        stream.close()
        # Something else completes: the engine is still serving.
        assert client.completions.create(model="echo", prompt="ok", max_tokens=2).choices[0].text == "ok"
        serve.interrupt()
        assert serve.wait(30) == 0, serve.output
        received = [line for line in serve.lines if "received request" in line]
        assert all(any(f"{i}_cmpl-" in line for line in received) for i in range(3)), serve.output
        assert "1 requests finished, 3 aborted" in serve.output, serve.output
    finally:
        serve.kill()
