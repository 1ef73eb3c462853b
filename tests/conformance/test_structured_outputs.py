"""Structured outputs through `python -m vllm_rs serve`, with
the real `openai` client: the toy model (random weights) answers a
`json_schema` response format with JSON that validates against the schema,
`structured_outputs` constraints (choice, regex) hold on chat and
completions, and bad constraints are 400s naming the field."""

from __future__ import annotations

import json
import re

import openai
import pytest

from tests.test_serve import Serve

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def toy():
    serve = Serve("--model", "toy", "--port", "0", "--max-model-len", "1024")
    try:
        serve.wait_ready()
        yield serve
    finally:
        serve.kill()


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_response_format_validates(toy, stream):
    jsonschema = pytest.importorskip("jsonschema")
    kwargs = dict(model="toy", messages=[{"role": "user", "content": "a person"}], max_tokens=300, seed=3,
                  response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}})  # fmt: skip
    client = toy.client()
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = chunks[-1].choices[0].finish_reason
    else:
        result = client.chat.completions.create(**kwargs)
        text, finish = result.choices[0].message.content, result.choices[0].finish_reason
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_and_structured_outputs_on_completions(toy):
    client = toy.client()
    result = client.chat.completions.create(
        model="toy",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=200,
        response_format={"type": "json_object"},
        # Seeded: the toy model's tokens are noise, and an unseeded walk
        # through the grammar may still be inside a string at max_tokens.
        seed=0,
    )
    assert result.choices[0].finish_reason == "stop", result.choices[0].message.content
    assert isinstance(json.loads(result.choices[0].message.content), dict)
    result = client.completions.create(
        model="toy", prompt="pick", max_tokens=20, extra_body={"structured_outputs": {"choice": ["red", "green"]}}
    )
    assert result.choices[0].text in ("red", "green")
    result = client.completions.create(
        model="toy", prompt="digits", max_tokens=20, extra_body={"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}}
    )
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", result.choices[0].text)


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"structured_outputs": {"regex": "a("}}, "structured_outputs", "structured_outputs.regex"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs", "structured_outputs.json"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "one kind"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs", "cannot be an empty list"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "'json_schema' field must be provided"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}}, "response_format",
         "not a JSON schema"),
    ],
)  # fmt: skip
def test_bad_constraints_are_400s_naming_the_field(toy, extra, param, says):
    with pytest.raises(openai.BadRequestError) as e:
        toy.client().chat.completions.create(
            model="toy", messages=[{"role": "user", "content": "x"}], max_tokens=4, extra_body=extra
        )
    assert e.value.body["param"] == param and says in e.value.body["message"], e.value.body
