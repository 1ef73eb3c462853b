"""The model's generation config as vLLM 0.33 applies it to OpenAI requests:
sampling defaults for what a request leaves unset (`get_diff_sampling_param`),
a server-wide `max_tokens` cap, and the extra EOS ids that become stop tokens
(`SamplingParams.update_from_generation_config`).

`generation_config` is `auto` (the model's `generation_config.json`, else the
generation keys of its `config.json`), `vllm` (no sampling defaults, but the
model's EOS ids still count, as in vLLM) or a folder to read instead;
`override_generation_config` is merged over the sampling defaults (a `None`
removes one). The Rust frontend's `generation_config.rs` applies it to
requests; `serve` loads it here only to refuse a bad one before anything
starts."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_rs.model_files import ModelNotFoundError, locate_model

GENERATION_CONFIG_FILE = "generation_config.json"
_MODEL_CONFIG_FILE = "config.json"
#: Generation keys a `config.json` may carry (Hugging Face `GenerationConfig` attributes vLLM reads).
_MODEL_CONFIG_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_new_tokens", "eos_token_id")
_TEXT_CONFIG_KEYS = ("decoder", "generator", "text_config")
_INT32_MAX = 2**31 - 1


class GenerationConfigError(ValueError):
    """A generation config that cannot be used; the message names the key and its source."""


def _penalty(v: float) -> bool:
    return -2.0 <= v <= 2.0


#: sampling key -> (what it must be, check); ints are marked by `int`.
_FLOAT_KEYS: dict[str, tuple[str, Callable[[float], bool]]] = {
    "temperature": ("a number >= 0", lambda v: v >= 0),
    "top_p": ("a number in (0, 1]", lambda v: 0 < v <= 1),
    "min_p": ("a number in [0, 1]", lambda v: 0 <= v <= 1),
    "repetition_penalty": ("a number > 0", lambda v: v > 0),
    "presence_penalty": ("a number in [-2, 2]", _penalty),
    "frequency_penalty": ("a number in [-2, 2]", _penalty),
}
_INT_KEYS = {"top_k": (-1, _INT32_MAX), "max_new_tokens": (1, _INT32_MAX)}


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise GenerationConfigError(f"cannot read {path}: {e}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise GenerationConfigError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise GenerationConfigError(f"{path} must hold a JSON object")
    return value


def read_config_dir(path: str) -> dict[str, Any] | None:
    """The generation keys of the folder `path`: its `generation_config.json`
    (non-null keys), else those of its `config.json`, else None."""
    keys = _read_json(os.path.join(path, GENERATION_CONFIG_FILE))
    if keys is not None:
        return {k: v for k, v in keys.items() if v is not None}
    config = _read_json(os.path.join(path, _MODEL_CONFIG_FILE))
    if config is None:
        return None
    text = next((config[k] for k in _TEXT_CONFIG_KEYS if isinstance(config.get(k), dict)), {})
    out = {}
    for key in _MODEL_CONFIG_KEYS:
        value = config.get(key)
        if value is None:
            value = text.get(key)
        if value is not None:
            out[key] = value
    return out


def _eos_ids(keys: Mapping[str, Any], origin: str) -> list[int]:
    value = keys.get("eos_token_id")
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**32 for i in ids):
        raise GenerationConfigError(
            f"generation config of {origin}: `eos_token_id` must be a token id or a list of them"
        )
    return list(ids)


@dataclass
class GenerationConfig:
    """What the server applies to every request."""

    #: Sampling defaults (vLLM names; `max_tokens` is `max_new_tokens`).
    defaults: dict[str, float | int] = field(default_factory=dict)
    #: Upper bound on every request's `max_tokens`.
    max_tokens_cap: int | None = None
    #: The generation config's `eos_token_id`s (the override never changes them).
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def load(cls, mode: str, overrides: Mapping[str, Any], model_dir: str | None) -> GenerationConfig:
        """Reads and validates; raises GenerationConfigError naming the key
        and where it came from, or the folder that cannot be found."""
        if mode in ("auto", "vllm"):
            origin = model_dir or ""
            file_keys = (read_config_dir(model_dir) if model_dir else None) or {}
        else:
            try:
                folder = locate_model(mode)
            except ModelNotFoundError as e:
                raise GenerationConfigError(f"--generation-config: {e}; or use `auto` or `vllm`") from None
            found = read_config_dir(folder)
            if found is None:
                raise GenerationConfigError(
                    f"--generation-config: {folder} holds neither {GENERATION_CONFIG_FILE} nor {_MODEL_CONFIG_FILE}"
                )
            origin, file_keys = folder, found
        eos_ids = _eos_ids(file_keys, origin)
        merged = {} if mode == "vllm" else dict(file_keys)
        merged.update(overrides)

        def name(key: str) -> str:
            if overrides.get(key) is not None:
                return f"override_generation_config.{key}"
            return f"generation config of {origin}: `{key}`"

        defaults: dict[str, float | int] = {}
        for key, (what, ok) in _FLOAT_KEYS.items():
            value = merged.get(key)
            if value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or not ok(value)
            ):
                raise GenerationConfigError(f"{name(key)} must be {what}")
            defaults[key] = float(value)
        for key, (low, high) in _INT_KEYS.items():
            value = merged.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise GenerationConfigError(f"{name(key)} must be an integer from {low} to {high}")
            defaults["max_tokens" if key == "max_new_tokens" else key] = value
        if mode in ("auto", "vllm"):
            cap = overrides.get("max_new_tokens")
        else:
            cap = defaults.get("max_tokens")
        return cls(defaults, None if cap is None else int(cap), eos_ids)
