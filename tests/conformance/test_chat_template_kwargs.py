"""`chat_template_kwargs`, `--default-chat-template-kwargs`,
`reasoning_effort` and `--reasoning-effort-map` through `python -m vllm_rs
serve`, on chat completions and the responses API, with the
real `openai` client. The model is `echo` with a Hugging Face tokenizer whose
template prints the `reasoning_effort` and `style` kwargs and ends
thinking-off prompts with a marker, so the echoed prompt shows what the
template got; the `qwen3` reasoning parser reads `enable_thinking` from the
same kwargs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import openai
import pytest

from tests.conformance.support import assert_error_shape, port_of, send
from tests.test_serve import Serve

TEMPLATE = (
    "{% if reasoning_effort is defined %}effort={{ reasoning_effort }};{% endif %}"
    "{% if style is defined %}style={{ style }};{% endif %}"
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] "
    "{% if enable_thinking is defined and not enable_thinking %}(no thinking){% endif %}{% endif %}"
)
STOP = ["\n[assistant]"]
MODEL = "kwargs-echo"
REASONED = [{"role": "user", "content": "thinking hard</think>The answer is 4"}]
#: The server's `--reasoning-effort-map`.
EFFORT_MAP = {"medium": "none", "xhigh": "max"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tokenizer directory: the byte-level BPE tokenizer with `TEMPLATE`."""
    directory = tmp_path_factory.mktemp("kwargs-echo")
    fixture = Path(__file__).parents[2] / "tests/fixtures/tokenizers/byte-bpe"
    shutil.copy(fixture / "tokenizer.json", directory)
    config = json.loads((fixture / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def stack(model_dir):
    """The echo model with the qwen3 reasoning parser, a server default `style` and `EFFORT_MAP`."""
    serve = Serve("--model", "echo", "--tokenizer", str(model_dir), "--port", "0",
                  "--reasoning-parser", "qwen3", "--default-chat-template-kwargs", '{"style": "server"}',
                  "--reasoning-effort-map", json.dumps(EFFORT_MAP),
                  "--served-model-name", MODEL, env={"HF_HUB_OFFLINE": "1"})  # fmt: skip
    try:
        serve.wait_ready()
        yield serve
    finally:
        serve.kill()


def _chat(stack, kwargs: dict | None = None, **extra):
    body = {} if kwargs is None else {"extra_body": {"chat_template_kwargs": kwargs}}
    return stack.client().chat.completions.create(
        model=MODEL, messages=REASONED, stop=STOP, max_tokens=400,
        **body, **extra,
    )  # fmt: skip


def _streamed(stack, kwargs: dict | None, **extra) -> tuple[str, str]:
    chunks = list(_chat(stack, kwargs, stream=True, **extra))
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning") or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return reasoning, content


def test_server_default_applies_and_the_request_overrides_it(stack):
    message = _chat(stack).choices[0].message
    assert message.model_extra["reasoning"] == "style=server;[user] thinking hard"
    assert message.content == "The answer is 4"
    message = _chat(stack, {"style": "terse", "unused": [1]}).choices[0].message
    assert message.model_extra["reasoning"] == "style=terse;[user] thinking hard"
    # null leaves the default in place, as vLLM's merge does.
    assert _chat(stack, {"style": None}).choices[0].message.model_extra["reasoning"].startswith("style=server;")


def test_thinking_off_makes_all_output_content(stack):
    message = _chat(stack, {"enable_thinking": False}).choices[0].message
    assert message.model_extra.get("reasoning") is None
    assert message.content == "style=server;[user] thinking hard</think>The answer is 4"
    assert _streamed(stack, {"enable_thinking": False}) == ("", message.content)
    assert _streamed(stack, {"enable_thinking": True}) == ("style=server;[user] thinking hard", "The answer is 4")


def test_tokenize_messages_get_the_kwargs(stack):
    port = port_of(stack)
    model = MODEL
    texts = []
    for kwargs in (None, {"style": "terse", "enable_thinking": False}):
        body = {"model": model, "messages": REASONED, **({} if kwargs is None else {"chat_template_kwargs": kwargs})}
        status, answer = send("POST", port, "/tokenize", body)
        assert status == 200, answer
        status, text = send("POST", port, "/detokenize", {"model": model, "tokens": answer["tokens"]})
        texts.append(text["prompt"])
    assert texts[0].startswith("style=server;[user] thinking hard") and texts[0].endswith("[assistant] ")
    assert texts[1].startswith("style=terse;") and texts[1].endswith("[assistant] (no thinking)")


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"chat_template": "{{ 1 }}"}, "Found unexpected chat template kwargs from request: {'chat_template'}"),
        ({"tokenize": True}, "Found unexpected chat template kwargs from request: {'tokenize'}"),
        ({"tools": []}, "cannot set `tools`"),
        ([1, 2], "must be an object"),
        ("enable_thinking", "must be an object"),
    ],
)
def test_bad_kwargs_are_400_naming_them(stack, kwargs, expected):
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(stack, kwargs)
    error = caught.value.body
    assert expected in error["message"] and error["param"] == "chat_template_kwargs", error
    model = MODEL
    body = {"model": model, "messages": REASONED, "chat_template_kwargs": kwargs}
    status, answer = send("POST", port_of(stack), "/tokenize", body)
    assert_error_shape(status, answer, 400, "chat_template_kwargs")
    assert expected in answer["error"]["message"], answer


@pytest.mark.parametrize(
    "effort, shown, thinking",
    [("high", "high", True), ("low", "low", True), ("none", "none", False),
     ("medium", "none", False), ("xhigh", "max", True)],  # the last two through EFFORT_MAP
)  # fmt: skip
def test_reasoning_effort_reaches_the_template_and_the_parser(stack, effort, shown, thinking):
    prompt = f"effort={shown};style=server;[user] thinking hard"
    message = _chat(stack, reasoning_effort=effort).choices[0].message
    streamed = _streamed(stack, None, reasoning_effort=effort)
    if thinking:
        assert (message.model_extra["reasoning"], message.content) == (prompt, "The answer is 4")
        assert streamed == (prompt, "The answer is 4")
    else:
        # enable_thinking follows the effort: off, the qwen3 parser reads it all as content.
        assert message.model_extra.get("reasoning") is None
        assert message.content == prompt + "</think>The answer is 4"
        assert streamed == ("", message.content)


def test_the_effort_wins_over_kwargs_but_not_over_their_enable_thinking(stack):
    message = _chat(stack, {"enable_thinking": True}, reasoning_effort="none").choices[0].message
    assert message.model_extra["reasoning"] == "effort=none;style=server;[user] thinking hard"
    message = _chat(stack, {"enable_thinking": False, "reasoning_effort": "low"}, reasoning_effort="high")
    assert message.choices[0].message.content.startswith("effort=high;style=server;")
    assert message.choices[0].message.model_extra.get("reasoning") is None


@pytest.mark.parametrize("effort", ["extreme", "HIGH", 3])
def test_bad_reasoning_effort_is_400_naming_it(stack, effort):
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(stack, reasoning_effort=effort)
    error = caught.value.body
    assert error["param"] == "reasoning_effort", error
    assert error["message"].startswith("`reasoning_effort` must be one of `none`, `minimal`, `low`"), error


def _respond(stack, **extra):
    """A response to REASONED's text; no stop string, so the echo model
    repeats the whole prompt, generation prompt included."""
    return stack.client().responses.create(model=MODEL, input=REASONED[0]["content"], max_output_tokens=300, **extra)


def _response_prompt(prefix: str, thinking: bool) -> str:
    return f"{prefix}[user] thinking hard</think>The answer is 4\n[assistant] {'' if thinking else '(no thinking)'}"


def test_responses_read_template_kwargs_and_reasoning_effort(stack):
    for extra, prefix, thinking in [
        ({}, "style=server;", True),
        ({"extra_body": {"chat_template_kwargs": {"style": "terse", "enable_thinking": False}}}, "style=terse;", False),
        ({"reasoning": {"effort": "low"}}, "effort=low;style=server;", True),
        ({"reasoning": {"effort": "medium", "summary": "auto"}}, "effort=none;style=server;", False),
        ({"reasoning": {"effort": "none"}, "extra_body": {"chat_template_kwargs": {"enable_thinking": True}}},
         "effort=none;style=server;", True),
    ]:  # fmt: skip
        response = _respond(stack, **extra)
        expected = _response_prompt(prefix, thinking)
        # The prompt whole, then its start again: nothing more before the echo repeats.
        assert response.output_text.startswith(expected + prefix[:4]), (extra, response.output_text)
        given = extra.get("reasoning")
        assert (response.reasoning and response.reasoning.model_dump(exclude_none=True)) == given
    streamed = list(_respond(stack, reasoning={"effort": "xhigh"}, stream=True))
    text = "".join(e.delta for e in streamed if e.type == "response.output_text.delta")
    assert text.startswith(_response_prompt("effort=max;style=server;", True))
    assert streamed[-1].response.reasoning.effort == "xhigh"


@pytest.mark.parametrize(
    "extra, param, expected",
    [
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "`reasoning.effort` must be one of `none`"),
        ({"reasoning": {"summary": "long"}}, "reasoning.summary", "`reasoning.summary` must be one of `auto`"),
        ({"extra_body": {"reasoning": "high"}}, "reasoning", "`reasoning` must be an object"),
        ({"extra_body": {"chat_template_kwargs": {"tokenize": True}}}, "chat_template_kwargs",
         "Found unexpected chat template kwargs from request: {'tokenize'}"),
        ({"extra_body": {"chat_template_kwargs": {"messages": []}}}, "chat_template_kwargs", "cannot set `messages`"),
        ({"extra_body": {"chat_template_kwargs": [1]}}, "chat_template_kwargs", "must be an object"),
    ],
)  # fmt: skip
def test_bad_responses_reasoning_and_kwargs_are_400_naming_them(stack, extra, param, expected):
    with pytest.raises(openai.BadRequestError) as caught:
        _respond(stack, **extra)
    error = caught.value.body
    assert error["param"] == param and expected in error["message"], error


def test_a_bad_reasoning_effort_map_stops_serve_with_vllms_message(model_dir):
    serve = Serve("--model", "echo", "--tokenizer", str(model_dir), "--port", "0",
                  "--reasoning-effort-map", '{"turbo": "high"}', env={"HF_HUB_OFFLINE": "1"})  # fmt: skip
    try:
        assert serve.wait(60) == 2, serve.output
    finally:
        serve.kill()
    assert "Error: --reasoning-effort-map has unknown efforts ['turbo']; keys must be one of" in serve.output
