"""The model's generation config as vLLM 0.33 applies it to OpenAI requests:
sampling defaults for what a request leaves unset (`get_diff_sampling_param`),
a server-wide `max_tokens` cap, and the extra EOS ids that become stop tokens
(`SamplingParams.update_from_generation_config`).

`generation_config` is `auto` (the model's `generation_config.json`, else the
generation keys of its `config.json`), `vllm` (no sampling defaults, but the
model's EOS ids still count, as in vLLM) or a folder to read instead;
`override_generation_config` is merged over the sampling defaults (a `None`
removes one). One implementation reads it, the Rust frontend's
(rust/model-files/src/generation_config.rs), which applies it to requests;
`serve` loads it through `vllm_rs._core` only to refuse a bad one before
anything starts."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_rs import _core
from vllm_rs._core import GenerationConfigError as GenerationConfigError


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
        and where it came from, or the folder that cannot be found (looked
        for with the Hugging Face variables of `os.environ`)."""
        overrides_json = json.dumps(dict(overrides))
        defaults, cap, eos_ids = _core.load_generation_config(mode, overrides_json, model_dir, dict(os.environ))
        return cls(defaults, cap, eos_ids)
