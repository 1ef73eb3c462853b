"""vLLM 0.33's smaller routes and the Responses API, end to end against both
frontends (`serve` with the echo engine): `/ping`, `/v1/models/{id}`,
`/tokenize`, `/detokenize` over plain HTTP, `/v1/responses` and model
retrieval with the real `openai` client. The echo engine repeats the prompt,
so every expected text below is the byte-level chat prompt
(`role: content` lines, then `assistant: `)."""

from __future__ import annotations

import json

import openai
import pytest

from tests.test_serve import API_KEY, Serve

AUTH = {"authorization": f"Bearer {API_KEY}"}
MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def stack():
    """echo on one engine behind an API key."""
    serve = Serve("--model", "echo", "--port", "0", "--max-model-len", str(MAX_MODEL_LEN),
                  env={"VLLM_API_KEY": API_KEY})  # fmt: skip
    try:
        serve.wait_ready()
        yield serve
        serve.interrupt()
        assert serve.wait(30) == 0, serve.output
    finally:
        serve.kill()


def post(stack: Serve, path: str, body: dict) -> tuple[int, dict]:
    status, raw = stack.http("POST", path, body, headers=AUTH)
    return status, json.loads(raw)


def assert_error(answer: dict, status: int, param: str | None, says: str) -> None:
    """The OpenAI error shape with `status`, naming `param`, saying `says`."""
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"}, answer
    assert (error["code"], error["param"]) == (status, param), answer
    assert says in error["message"], answer
    # vLLM types its 404 for an unknown response id `invalid_request_error`.
    expected = (
        "invalid_request_error" if param == "response_id" else {400: "BadRequestError", 404: "NotFoundError"}[status]
    )
    assert error["type"] == expected


def test_ping_answers_like_health_for_get_and_post_without_a_key(stack):
    assert stack.http("GET", "/ping") == (200, b"")
    assert stack.http("POST", "/ping") == (200, b"")
    assert stack.http("GET", "/health") == (200, b"")
    assert stack.http("PUT", "/ping")[0] == 405


def test_models_retrieve_gives_the_card_and_404_for_an_unknown_id(stack):
    client = stack.client()
    card = client.models.retrieve("echo")
    assert (card.id, card.object, card.owned_by) == ("echo", "model", "vllm-rs")
    assert card.model_extra["max_model_len"] == MAX_MODEL_LEN
    listed = client.models.list().data[0]
    assert card.model_dump() == listed.model_dump()
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no-such-model")
    assert_error({"error": caught.value.body}, 404, "model", "`no-such-model` does not exist")
    assert stack.http("GET", "/v1/models/echo")[0] == 401  # the key is still required


def test_tokenize_a_prompt_with_and_without_token_strings(stack):
    status, answer = post(stack, "/tokenize", {"model": "echo", "prompt": "hi\n"})
    assert status == 200
    assert answer == {"count": 3, "max_model_len": MAX_MODEL_LEN, "tokens": [104, 105, 10], "token_strs": None}
    _, answer = post(stack, "/tokenize", {"prompt": "hé", "return_token_strs": True, "add_special_tokens": False})
    assert answer["tokens"] == [104, 0xC3, 0xA9]
    assert answer["token_strs"] == ["h", "<0xC3>", "<0xA9>"]


def test_tokenize_chat_messages_through_the_chat_template(stack):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    _, answer = post(stack, "/tokenize", {"messages": messages})
    assert bytes(answer["tokens"]).decode() == "system: s\nuser: hi\nassistant: "
    assert answer["count"] == len(answer["tokens"])
    _, answer = post(stack, "/tokenize", {"messages": messages, "add_generation_prompt": False})
    assert bytes(answer["tokens"]).decode() == "system: s\nuser: hi\n"


def test_tokenize_errors_name_the_field(stack):
    assert_error(post(stack, "/tokenize", {})[1], 400, "prompt", "`messages` is required")
    assert_error(post(stack, "/tokenize", {"prompt": 5})[1], 400, "prompt", "must be")
    assert_error(post(stack, "/tokenize", {"prompt": "x", "model": "nope"})[1], 404, "model", "does not exist")
    body = {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"}
    assert_error(post(stack, "/tokenize", body)[1], 400, "chat_template", "not supported")
    body = {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True}
    assert_error(post(stack, "/tokenize", body)[1], 400, "continue_final_message", "Cannot set both")


def test_detokenize_keeps_text_and_refuses_ids_outside_the_vocabulary(stack):
    assert post(stack, "/detokenize", {"model": "echo", "tokens": [104, 0xC3, 0xA9, 256]}) == (200, {"prompt": "hé"})
    assert post(stack, "/detokenize", {"tokens": []}) == (200, {"prompt": ""})
    status, answer = post(stack, "/detokenize", {"tokens": [104, 300]})
    assert status == 400
    assert_error(answer, 400, "tokens", "Token id 300 is out of vocabulary")
    assert_error(post(stack, "/detokenize", {"tokens": [-1]})[1], 400, "tokens", "Token id -1 is out of vocabulary")
    assert_error(post(stack, "/detokenize", {})[1], 400, "tokens", "must be")


def test_response_from_text_input(stack):
    prompt = "user: hi\nassistant: "
    response = stack.client().responses.create(model="echo", input="hi", max_output_tokens=8)
    assert response.id.startswith("resp_") and response.object == "response" and response.model == "echo"
    assert response.output_text == "user: hi"
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    (item,) = response.output
    assert (item.type, item.role, item.status) == ("message", "assistant", "incomplete")
    assert item.id.startswith("msg_") and item.content[0].type == "output_text"
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (len(prompt), 8, len(prompt) + 8)
    assert (response.max_output_tokens, response.temperature, response.top_p) == (8, 1.0, 1.0)
    assert (response.tools, response.tool_choice, response.background) == ([], "none", False)


def test_response_from_input_messages_and_instructions_ends_at_a_stop_string(stack):
    response = stack.client().responses.create(
        model="echo",
        instructions="be brief",
        input=[
            {"role": "user", "content": "hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "yo"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "again"}]},
        ],
        metadata={"run": "1"},
        extra_body={"stop": ["\n"]},
    )
    assert response.output_text == "system: be brief"
    assert response.status == "completed" and response.incomplete_details is None
    assert response.output[0].status == "completed"
    assert response.instructions == "be brief" and response.metadata == {"run": "1"}
    # The room left by the prompt, as vLLM fills max_output_tokens in.
    prompt = "system: be brief\nuser: hi\nassistant: yo\nuser: again\nassistant: "
    assert response.max_output_tokens == MAX_MODEL_LEN - len(prompt)
    assert response.usage.input_tokens == len(prompt)


def test_streamed_response_sends_vllms_event_sequence(stack):
    events = list(stack.client().responses.create(model="echo", input="hey", stream=True, extra_body={"stop": ["\n"]}))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert deltas and "".join(d.delta for d in deltas) == "user: hey"
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    item_ids = {e.item_id for e in events[3:-2] if hasattr(e, "item_id")}
    assert item_ids == {events[2].item.id}
    assert events[-4].text == "user: hey" and events[-3].part.text == "user: hey"
    final = events[-1].response
    assert final.status == "completed" and final.output_text == "user: hey"
    assert final.output[0].id == events[2].item.id
    assert final.usage.input_tokens == len("user: hey\nassistant: ")


def test_streamed_response_ends_incomplete_at_the_token_limit_with_typed_sse(stack):
    status, raw = stack.http("POST", "/v1/responses", {"input": "ab", "max_output_tokens": 4, "stream": True},
                             headers=AUTH)  # fmt: skip
    assert status == 200
    blocks = [b for b in raw.decode().split("\n\n") if b]
    kinds = []
    for block in blocks:
        event_line, data_line = block.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {data['type']}"
        kinds.append(data["type"])
    assert kinds[-1] == "response.incomplete"
    final = json.loads(blocks[-1].split("\n")[1].removeprefix("data: "))["response"]
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["content"][0]["text"] == "user" and final["output"][0]["status"] == "incomplete"
    assert "[DONE]" not in raw.decode()


@pytest.mark.parametrize(
    ("body", "status", "param", "says"),
    [
        ({"input": "x", "tools": [{"type": "function", "name": "f"}]}, 400, "tools", "not supported"),
        ({"input": "x", "background": True}, 400, "background", "does not support `store=True`"),
        ({"input": "x", "previous_response_id": "resp_1"}, 404, "response_id", "'resp_1' not found"),
        # `reasoning` and `chat_template_kwargs` are served: test_chat_template_kwargs.py.
        ({"input": "x", "reasoning": {"effort": "extreme"}}, 400, "reasoning.effort", "must be one of"),
        ({"input": "x", "structured_outputs": {"regex": "a"}}, 400, "structured_outputs", "not supported"),
        ({"input": "x", "include": ["message.output_text.logprobs"]}, 400, "include", "not supported"),
        ({"input": "x", "text": {"format": {"type": "json_object"}}}, 400, "text", "only the `text` format"),
        ({"input": "x", "tool_choice": "required"}, 400, "tool_choice", "must be specified with 'tools'"),
        ({"input": "x", "truncation": "auto"}, 400, "truncation", "not supported"),
        ({"input": "x", "prompt": {"id": "p"}}, 400, "prompt", "prompt template is not supported"),
        ({}, 400, "input", "`input` is required"),
        ({"input": [{"type": "function_call", "name": "f"}]}, 400, "input", "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, 400, "input", "input[0]"),
        ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens", "at least 1"),
        ({"input": "x", "temperature": 9}, 400, "temperature", "temperature"),
        ({"input": "x", "model": "nope"}, 404, "model", "does not exist"),
    ],
)
def test_responses_refuses_what_it_does_not_do_naming_the_field(stack, body, status, param, says):
    got, answer = post(stack, "/v1/responses", body)
    assert got == status, answer
    assert_error(answer, status, param, says)
