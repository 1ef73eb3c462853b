"""The request rules both frontends share: `request_rules.json` next to this
module (vLLM 0.33's checks with vLLM's messages, plus this project's limits).
The Rust frontend embeds the same file, so the two cannot drift."""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Any

from vllm_rs.api_server.errors import ApiError


class Rules:
    """The rule table: limits, the type each field must have, range rules
    per parameter (first failing rule wins) and message templates."""

    def __init__(self, table: dict[str, Any]):
        self.limits: dict[str, int] = table["limits"]
        self.types: dict[str, str] = table["types"]
        self.ranges: dict[str, list[dict[str, Any]]] = table["ranges"]
        self.messages: dict[str, str] = table["messages"]

    def check_number(self, param: str, value: float | int) -> None:
        """Raises a 400 naming `param` with the message of the first range
        rule `value` fails (`{value}` written as Python writes it)."""
        for rule in self.ranges.get(param, ()):
            if not _passes(rule, value):
                raise ApiError.invalid_param(param, rule["message"].replace("{value}", repr(value)))

    def message(self, key: str, /, **values: Any) -> str:
        """The message `key` with each `{name}` replaced by its value."""
        text = self.messages.get(key, key)
        for name, value in values.items():
            text = text.replace("{" + name + "}", str(value))
        return text

    def refuse(self, param: str, key: str, /, **values: Any) -> ApiError:
        """A 400 naming `param` with the message `key`."""
        return ApiError.invalid_param(param, self.message(key, **values))

    def wrong_type(self, param: str) -> ApiError:
        """A 400 saying what type `param` must have."""
        expected = self.types.get(param)
        if expected is None:
            return ApiError.invalid_param(param, f"`{param}` has the wrong type")
        return ApiError.invalid_param(param, f"`{param}` must be {expected}")


def _passes(rule: dict[str, Any], value: float | int) -> bool:
    if "or_equal" in rule and value == rule["or_equal"]:
        return True
    if rule.get("finite") and not math.isfinite(value):
        return False
    if "at_least" in rule and not value >= rule["at_least"]:
        return False
    if "above" in rule and not value > rule["above"]:
        return False
    return not ("at_most" in rule and not value <= rule["at_most"])


#: The table, loaded once from the package data.
RULES = Rules(json.loads(resources.files("vllm_rs.api_server").joinpath("request_rules.json").read_text("utf-8")))
