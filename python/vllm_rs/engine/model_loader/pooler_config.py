"""How a pooling model turns hidden states into one vector per input, read
without torch (`serve` checks it before anything starts): the pooler
settings (`--pooler-config`, a sentence-transformers folder's
`modules.json` and `1_Pooling/config.json`, as vLLM reads them), the
encoder architectures, and which runner and task (`--runner`,
`--convert`) a checkpoint gets."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any

#: Sequence pooling types (vLLM's names).
POOLING_TYPES = ("CLS", "LAST", "MEAN")
#: `--runner` and `--convert` choices, as vLLM 0.33's.
RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed", "classify")
#: Encoder architectures the engine runs (`models/bert.py`), and the task each
#: serves without `--convert`.
ENCODER_ARCHITECTURES = {"BertModel": "embed", "BertForSequenceClassification": "classify"}
#: The tasks an engine reports (`get_supported_tasks`) for each pooling task.
SUPPORTED_TASKS = {"embed": ["embed", "token_embed"], "classify": ["classify"]}
#: sentence-transformers' pooling modes -> vLLM's pooling types.
_ST_MODES = {"cls_token": "CLS", "mean_tokens": "MEAN", "lasttoken": "LAST"}
_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"


class PoolerConfigError(ValueError):
    """A pooler setting that cannot work (names the setting)."""


@dataclass(frozen=True)
class PoolerConfig:
    """vLLM's `PoolerConfig` fields the engine honours; None: the model's default."""

    pooling_type: str | None = None
    #: An embedding's L2 normalization, a classifier's sigmoid or softmax.
    use_activation: bool | None = None
    dimensions: int | None = None

    def over(self, base: PoolerConfig) -> PoolerConfig:
        """This config with `base`'s values where this one says nothing."""
        return replace(base, **{k: v for k, v in self.__dict__.items() if v is not None})


def parse_pooler_config(value: str | dict[str, Any]) -> PoolerConfig:
    """`--pooler-config` (a JSON object, vLLM's keys; `seq_pooling_type` is
    `pooling_type`'s other name); raises PoolerConfigError naming the flaw."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise PoolerConfigError(f"--pooler-config: not JSON: {e}") from None
    if not isinstance(value, dict):
        raise PoolerConfigError("--pooler-config: must be a JSON object")
    if "normalize" in value:
        # Removed in vLLM 0.33, with this message.
        raise PoolerConfigError("--pooler-config: Parameter `normalize` was removed; use `use_activation` instead.")
    known = {"pooling_type", "seq_pooling_type", "use_activation", "dimensions", "task"}
    unknown = sorted(set(value) - known)
    if unknown:
        raise PoolerConfigError(f"--pooler-config: unsupported keys {', '.join(unknown)}")
    pooling = value.get("pooling_type") or value.get("seq_pooling_type")
    if pooling is not None and pooling not in POOLING_TYPES:
        raise PoolerConfigError(f"--pooler-config: pooling_type {pooling!r} is not one of {', '.join(POOLING_TYPES)}")
    if value.get("use_activation") is not None and not isinstance(value["use_activation"], bool):
        raise PoolerConfigError("--pooler-config: use_activation must be true or false")
    dims = value.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
        raise PoolerConfigError("--pooler-config: dimensions must be a positive integer")
    return PoolerConfig(pooling, value.get("use_activation"), dims)


def sentence_transformers_pooler(model_dir: str) -> PoolerConfig | None:
    """The pooling a sentence-transformers folder declares, read as vLLM
    reads it: the first mode set true in the Pooling module's config, and
    `use_activation` (normalize) when a Normalize module follows; None
    without `modules.json`."""
    modules = _read_json(os.path.join(model_dir, "modules.json"))
    if not isinstance(modules, list):
        return None
    pooling = next((m for m in modules if isinstance(m, dict) and m.get("type") == _ST_POOLING), None)
    normalize = any(isinstance(m, dict) and m.get("type") == _ST_NORMALIZE for m in modules)
    if pooling is None:
        return PoolerConfig(use_activation=normalize)
    settings = _read_json(os.path.join(model_dir, str(pooling.get("path", "")), "config.json"))
    mode = next((k for k, v in (settings or {}).items() if v is True), None)
    name = _ST_MODES.get(mode.removeprefix("pooling_mode_")) if mode else None
    return PoolerConfig(pooling_type=name, use_activation=normalize)


def sentence_transformers_max_len(model_dir: str) -> int | None:
    """`max_seq_length` of `sentence_bert_config.json` (vLLM caps the model
    length with it), when there is one."""
    value = (_read_json(os.path.join(model_dir, "sentence_bert_config.json")) or {}).get("max_seq_length")
    return value if isinstance(value, int) and value > 0 else None


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


@dataclass(frozen=True)
class RunnerChoice:
    """What an engine runs a checkpoint as: `generate`, or `pooling` with
    its task (`embed` or `classify`)."""

    runner: str
    task: str | None = None

    @property
    def is_pooling(self) -> bool:
        """True for a pooling runner."""
        return self.runner == "pooling"


def resolve_runner(runner: str, convert: str, architecture: str) -> RunnerChoice:
    """`--runner`/`--convert` made concrete for `architecture`, as vLLM 0.33:
    `auto` pools an encoder architecture and generates with a decoder; a
    pooled decoder embeds unless converted to classify. Raises
    PoolerConfigError for a choice that cannot run."""
    if runner not in RUNNERS:
        raise PoolerConfigError(f"--runner: invalid choice {runner!r} (choose from {', '.join(RUNNERS)})")
    if convert not in CONVERTS:
        raise PoolerConfigError(f"--convert: invalid choice {convert!r} (choose from {', '.join(CONVERTS)})")
    encoder_task = ENCODER_ARCHITECTURES.get(architecture)
    if runner == "auto":
        runner = "pooling" if encoder_task or convert in ("embed", "classify") else "generate"
    if runner == "generate":
        if encoder_task:
            raise PoolerConfigError(f"--runner generate: {architecture} is an encoder; it runs with --runner pooling")
        if convert in ("embed", "classify"):
            raise PoolerConfigError(f"--convert {convert}: needs --runner pooling")
        return RunnerChoice("generate")
    if convert in ("embed", "classify"):
        if encoder_task and convert != encoder_task:
            raise PoolerConfigError(f"--convert {convert}: {architecture} serves {encoder_task} only")
        return RunnerChoice("pooling", convert)
    if encoder_task:
        return RunnerChoice("pooling", encoder_task)
    if convert == "none":
        raise PoolerConfigError(f"--runner pooling: {architecture} has no pooler of its own; add --convert embed")
    return RunnerChoice("pooling", "embed")


def default_pooling_type(architecture: str) -> str:
    """The pooling a model uses when nothing says: CLS for BERT (vLLM's
    default for it), the last token for a decoder."""
    return "CLS" if architecture in ENCODER_ARCHITECTURES else "LAST"
