"""`chat_template_kwargs` and `--default-chat-template-kwargs` through
`python -m vllm_rs serve`, both frontends, with the real `openai` client. The
model is `echo` with a Hugging Face tokenizer whose template prints the
`style` kwarg and ends thinking-off prompts with a marker, so the echoed
prompt shows what the template got; the `qwen3` reasoning parser reads
`enable_thinking` from the same kwargs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import openai
import pytest

from tests.conformance.support import assert_error_shape, port_of, send
from tests.test_serve import FRONTENDS, Serve

TEMPLATE = (
    "{% if style is defined %}style={{ style }};{% endif %}"
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] "
    "{% if enable_thinking is defined and not enable_thinking %}(no thinking){% endif %}{% endif %}"
)
STOP = ["\n[assistant]"]
MODEL = "kwargs-echo"
REASONED = [{"role": "user", "content": "thinking hard</think>The answer is 4"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tokenizer directory: the byte-level BPE tokenizer with `TEMPLATE`."""
    directory = tmp_path_factory.mktemp("kwargs-echo")
    fixture = Path(__file__).parents[2] / "frontend-bin/tests/fixtures/byte-bpe"
    shutil.copy(fixture / "tokenizer.json", directory)
    config = json.loads((fixture / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module", params=FRONTENDS)
def stack(request, model_dir):
    """The echo model with the qwen3 reasoning parser and a server default `style`."""
    serve = Serve("--model", "echo", "--tokenizer", str(model_dir), "--port", "0", "--frontend", request.param,
                  "--reasoning-parser", "qwen3", "--default-chat-template-kwargs", '{"style": "server"}',
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


def _streamed(stack, kwargs: dict) -> tuple[str, str]:
    chunks = list(_chat(stack, kwargs, stream=True))
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
