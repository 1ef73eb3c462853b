"""Structured outputs in the reference engine: vLLM 0.33's
`structured_outputs` sampling param, compiled with llguidance against the
byte vocabulary and enforced on the toy model's logits every step, so what it
writes parses (JSON that validates against the schema, regex and grammar
matches, one of the choices) whatever the seed; bad specifications fail only
their own request, with vLLM's validation error."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from vllm_rs.engine import make_engine_config
from vllm_rs.engine.core import EngineCore
from vllm_rs.engine.model_loader.registry import BYTE_EOS_TOKEN_ID
from vllm_rs.engine.protocol import EngineCoreRequest, FinishReason

SCHEMAS = {
    "object": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "ok": {"type": "boolean"},
        },
        "required": ["name", "age", "ok"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
        "additionalProperties": False,
    },
    "array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 4},
    "nested": {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer", "maximum": 99}, "y": {"type": "integer", "maximum": 99}},
                "required": ["x", "y"],
                "additionalProperties": False,
            },
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        },
        "required": ["point", "tags"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def core():
    return EngineCore(make_engine_config("toy", max_model_len=512, max_num_seqs=16))


def generate(core: EngineCore, requests: dict[str, dict]) -> dict[str, tuple[str, FinishReason]]:
    """Runs `request id -> sampling params` together; id -> (text, finish reason)."""
    for request_id, sampling in requests.items():
        params = {"max_tokens": 300, "_eos_token_id": BYTE_EOS_TOKEN_ID, **sampling}
        assert core.add_request(EngineCoreRequest(request_id, list(b"Answer: "), params)) is None
    tokens: dict[str, list[int]] = {}
    finished: dict[str, FinishReason] = {}
    while core.has_work():
        for _, output in core.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
            if output.finish_reason is not None:
                finished[output.request_id] = output.finish_reason
    return {rid: (bytes(t for t in ids if t < 256).decode(), finished[rid]) for rid, ids in tokens.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schemas_are_followed_at_temperature_one(core, seed):
    requests = {
        name: {"temperature": 1.0, "seed": seed, "structured_outputs": {"json": schema, "disable_any_whitespace": True}}
        for name, schema in SCHEMAS.items()
    }
    requests["json_object"] = {"temperature": 1.0, "seed": seed, "structured_outputs": {"json_object": True}}
    results = generate(core, requests)
    for name, schema in SCHEMAS.items():
        text, reason = results[name]
        assert reason == FinishReason.STOP, (name, text)  # the grammar completed, then EOS
        jsonschema.validate(json.loads(text), schema)
    text, reason = results["json_object"]
    assert reason == FinishReason.STOP and isinstance(json.loads(text), dict)


def test_a_schema_given_as_a_json_string_is_read_like_a_map(core):
    ((text, _),) = generate(core, {"s": {"structured_outputs": {"json": json.dumps(SCHEMAS["enum"])}}}).values()
    assert json.loads(text)["color"] in ("red", "green", "blue")


def test_regex_choice_and_grammars_are_followed(core):
    results = generate(
        core,
        {
            "regex": {"temperature": 1.0, "seed": 5, "structured_outputs": {"regex": "[a-c]{3}-[0-9]{2}"}},
            "choice": {"temperature": 1.0, "seed": 5, "structured_outputs": {"choice": ["yes", "no", "maybe"]}},
            "gbnf": {"temperature": 1.0, "seed": 5, "structured_outputs": {"grammar": 'root ::= "a" [0-9]{1,5} "b"'}},
            "lark": {"temperature": 1.0, "seed": 5, "structured_outputs": {"grammar": 'start: "x" ("y" | "z")'}},
        },
    )
    assert re.fullmatch("[a-c]{3}-[0-9]{2}", results["regex"][0])
    assert results["choice"][0] in ("yes", "no", "maybe")
    assert re.fullmatch("a[0-9]{1,5}b", results["gbnf"][0])
    assert results["lark"][0] in ("xy", "xz")
    assert all(reason == FinishReason.STOP for _, reason in results.values())


def test_max_tokens_still_cuts_a_structured_output(core):
    ((text, reason),) = generate(
        core,
        {"cut": {"max_tokens": 3, "structured_outputs": {"json": SCHEMAS["object"], "disable_any_whitespace": True}}},
    ).values()
    assert reason == FinishReason.LENGTH and text.startswith('{"')


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"json": {"type": "nope"}}, "Grammar error"),
        ({"json": "{not json"}, "Invalid grammar specification"),
        ({"regex": "[a-"}, "Grammar error"),
        ({"grammar": "root ::= ("}, "Invalid grammar specification"),
        ({"choice": "yes"}, "Invalid grammar specification"),
        ({"regex": "a", "choice": ["a"]}, "only use one kind"),
        ({"regex": None}, "only use one kind"),
    ],
)
def test_bad_specifications_fail_only_their_request(core, spec, message):
    error = core.add_request(EngineCoreRequest("bad", [1], {"structured_outputs": spec}))
    assert error.finish_reason == FinishReason.ERROR and error.error.code == "validation_error"
    assert message in error.error.message
    ((text, reason),) = generate(core, {"fine": {"structured_outputs": {"choice": ["ok"]}}}).values()
    assert (text, reason) == ("ok", FinishReason.STOP)


def test_the_echo_model_refuses_structured_outputs():
    echo = EngineCore(make_engine_config("echo", max_model_len=64))
    error = echo.add_request(EngineCoreRequest("e", [1], {"structured_outputs": {"choice": ["a"]}}))
    assert error.finish_reason == FinishReason.ERROR and "cannot follow structured outputs" in error.error.message


def test_grammars_on_a_real_vocabulary_allow_exactly_the_valid_tokens(tmp_path):
    """The packaged SmolLM2's rebuilt tokenizer (49152 tokens): a valid JSON
    answer's tokens are each allowed in turn, then only EOS; a token that
    would break the JSON is masked out."""
    from tokenizers import Tokenizer
    from vllm_rs.engine.sample.structured_output import GrammarMatcher, compile_grammar, grammar_vocabulary
    from vllm_rs.model_files import ModelNotFoundError, packaged_model_path
    from vllm_rs.tokenizer.gguf import tokenizer_dir

    try:
        gguf = packaged_model_path()
    except ModelNotFoundError as e:
        pytest.skip(f"the packaged SmolLM2 GGUF is not installed: {e}")
    folder = tokenizer_dir(gguf, cache=str(tmp_path / "cache"))
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    vocabulary = grammar_vocabulary(folder, 49152)
    assert vocabulary.eos_token_ids == (tokenizer.token_to_id("<|im_end|>"),)
    params = {"json": SCHEMAS["object"], "disable_any_whitespace": True}
    matcher = GrammarMatcher(compile_grammar(params, vocabulary), vocabulary)
    answer = '{"name":"Ana","age":31,"ok":true}'
    ids = tokenizer.encode(answer, add_special_tokens=False).ids
    assert len(ids) < len(answer), "multi-byte tokens, not bytes"
    for i, token in enumerate(ids):
        allowed = matcher.allowed(49152)
        assert allowed[token], (i, tokenizer.id_to_token(token))
        if i == 0:
            assert not allowed[tokenizer.token_to_id("Hello")] and not allowed[vocabulary.eos_token_ids[0]]
        matcher.accept(token)
    allowed = matcher.allowed(49152)
    assert allowed.nonzero()[0].tolist() == list(vocabulary.eos_token_ids)
