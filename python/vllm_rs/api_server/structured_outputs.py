"""`response_format` and vLLM's `structured_outputs` request field, read as
vLLM 0.33 reads them (a `json_object` / `json_schema` response format
overrides the matching field of `structured_outputs`; exactly one constraint
kind in the end) and sent to the engine in the sampling params as vLLM's
encoder writes its `StructuredOutputsParams`. The same checks as the Rust
frontend's (`frontend-bin/src/http/structured.rs`), with the shared rule
table's messages; a bad value is a 400 naming the field it came from."""

from __future__ import annotations

import json
import re
from typing import Any

from vllm_rs.api_server.request_rules import RULES

#: The constraint kinds of vLLM's StructuredOutputsParams.
CONSTRAINT_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
#: The options of vLLM's StructuredOutputsParams, with their defaults.
OPTION_DEFAULTS: dict[str, Any] = {
    "disable_any_whitespace": False,
    "disable_additional_properties": False,
    "whitespace_pattern": None,
}
_OPTION_TYPES = {"disable_any_whitespace": bool, "disable_additional_properties": bool, "whitespace_pattern": str}


def wire_params(fields: dict[str, Any]) -> dict[str, Any]:
    """The sampling params' `structured_outputs` map as vLLM's msgpack
    encoder writes the dataclass: every field in declaration order, the
    backend resolved as vLLM's `auto` mode resolves it when xgrammar is not
    used (`guidance`, the llguidance grammars both frontends check against)."""
    out: dict[str, Any] = {}
    for kind in CONSTRAINT_KINDS[:5]:
        out[kind] = fields.get(kind)
    for option, default in OPTION_DEFAULTS.items():
        out[option] = fields.get(option, default)
    out["structural_tag"] = fields.get("structural_tag")
    out["_backend"] = "guidance"
    out["_backend_was_auto"] = True
    return out


def _response_format_override(response_format: Any) -> dict[str, Any] | None:
    """What a `response_format` sets in the constraint (None for `text`)."""
    if not isinstance(response_format, dict):
        raise RULES.wrong_type("response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        json_schema = response_format.get("json_schema")
        if json_schema is None:
            raise RULES.refuse("response_format", "json_schema_missing")
        if not isinstance(json_schema, dict):
            raise RULES.wrong_type("response_format")
        schema = json_schema.get("schema")
        if schema is None:
            raise RULES.refuse("response_format", "structured_outputs_bad_schema",
                               param="response_format.json_schema.schema", why="it is missing")  # fmt: skip
        return {"json": schema}
    if kind == "structural_tag":
        raise RULES.refuse("response_format", "structural_tag_unsupported")
    raise RULES.wrong_type("response_format")


def _structured_outputs_fields(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RULES.wrong_type("structured_outputs")
    fields = {k: v for k, v in value.items() if k in CONSTRAINT_KINDS and v is not None}
    for option, kind in _OPTION_TYPES.items():
        given = value.get(option)
        if given is not None:
            if not isinstance(given, kind):
                raise RULES.wrong_type("structured_outputs")
            fields[option] = given
    return fields


def _check_schema(param: str, schema: Any) -> None:
    if isinstance(schema, str):
        if not schema.strip():
            raise RULES.refuse(param, "structured_outputs_empty_string", kind="json")
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError) as e:
            raise RULES.refuse(param, "structured_outputs_bad_schema", param=f"{param}.json", why=str(e)) from None
    if not isinstance(schema, (dict, bool)):
        raise RULES.refuse(param, "structured_outputs_bad_schema", param=f"{param}.json",
                           why="a schema is an object or a boolean")  # fmt: skip


def _check(param: str, kind: str, spec: Any) -> None:
    """vLLM's checks of one constraint (`SamplingParams._validate_structured_outputs`)."""
    if kind == "json":
        _check_schema(param, spec)
    elif kind == "regex":
        if not isinstance(spec, str):
            raise RULES.wrong_type(param)
        why = "it holds a NUL character" if "\x00" in spec else None
        if why is None:
            try:
                re.compile(spec)
            except (re.error, OverflowError, RecursionError, ValueError) as e:
                why = str(e) or type(e).__name__
        if why is not None:
            raise RULES.refuse(param, "structured_outputs_bad_regex", param=f"{param}.regex", why=why)
    elif kind == "choice":
        if not isinstance(spec, list) or not all(isinstance(c, str) for c in spec):
            raise RULES.wrong_type(param)
        if not spec:
            raise RULES.refuse(param, "structured_outputs_empty_choice")
    elif kind == "grammar":
        if not isinstance(spec, str):
            raise RULES.wrong_type(param)
        if not spec.strip():
            raise RULES.refuse(param, "structured_outputs_empty_string", kind="grammar")
    elif kind == "json_object":
        if spec is not True:
            raise RULES.refuse(param, "structured_outputs_json_object_false")
    else:
        raise RULES.refuse(param, "structural_tag_unsupported")


def read_structured_outputs(body: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The request's constraint fields (`structured_outputs` with the
    `response_format` override applied), checked, and the field they came
    from; `(None, None)` when the request has none."""
    fields: dict[str, Any] | None = None
    param = None
    if body.get("structured_outputs") is not None:
        fields = _structured_outputs_fields(body["structured_outputs"])
        param = "structured_outputs"
    if body.get("response_format") is not None:
        override = _response_format_override(body["response_format"])
        if override is not None:
            fields = {**(fields or {}), **override}
            param = "response_format"
    if fields is None or param is None:
        return None, None
    kinds = [k for k in CONSTRAINT_KINDS if fields.get(k) is not None]
    if len(kinds) != 1:
        raise RULES.refuse(param, "structured_outputs_kinds", count=len(kinds))
    _check(param, kinds[0], fields[kinds[0]])
    return fields, param
