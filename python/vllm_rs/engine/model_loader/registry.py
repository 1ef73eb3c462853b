"""Which model an engine runs: the built-in names `toy` and `echo`; a model
directory whose `config.json` names one of them (`"model_type"`), with the
toy model's hyperparameters and, optionally, its weights in `model.pt`; a
real model's directory (`config.json` naming a supported architecture, and
`*.safetensors` weights); or a `.gguf` file.

Nothing here imports torch: `serve` validates `--model` before starting
anything.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from vllm_rs.engine.model_loader.bert_config import BertConfig, bert_config_from_hf
from vllm_rs.engine.model_loader.checkpoint import (
    CheckpointError,
    TransformerConfig,
    config_from_hf,
    read_gguf,
    safetensors_files,
)
from vllm_rs.engine.model_loader.gguf_file import KERNEL_BLOCKS

#: Model types the reference engine runs.
MODEL_TYPES = ("toy", "echo")
#: The byte-level vocabulary: ids 0..255 are bytes, 256 is end-of-sequence.
BYTE_VOCAB_SIZE = 257
BYTE_EOS_TOKEN_ID = 256
#: The weights file of a model directory (a torch state dict).
WEIGHTS_FILE = "model.pt"
CONFIG_FILE = "config.json"

#: The toy model's default hyperparameters (tiny: a CPU runs it).
TOY_DEFAULTS: dict[str, Any] = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "intermediate_size": 256,
    "max_position_embeddings": 2048,
    "seed": 0,
}
#: max_model_len when nothing says otherwise.
DEFAULT_MAX_MODEL_LEN = {"toy": 1024, "echo": 8192}


class ModelPathError(ValueError):
    """`--model` is neither a built-in name nor a usable model directory."""


@dataclass
class ModelSpec:
    """A resolved model: its type (`toy`, `echo`, or a real model's Hugging
    Face `model_type`), where it came from, its hyperparameters."""

    model_type: str
    source: str
    hparams: dict[str, Any] = field(default_factory=dict)
    #: `model.pt` of a toy directory; the `.gguf` file of a GGUF model.
    weights_path: str | None = None
    #: A real model's decoder config (None for toy and echo).
    transformer: TransformerConfig | None = None
    #: An encoder's config (BERT), None for every other model.
    encoder: BertConfig | None = None
    #: A real model's safetensors files, in load order.
    weight_files: list[str] = field(default_factory=list)
    #: The directory holding the model's `tokenizer.json` (the model
    #: directory when it has one; set by `serve` for a GGUF).
    tokenizer_dir: str | None = None
    #: True for a GGUF with tensors the Rust kernel reads in place (every
    #: type but F32 and the other i-quants), which `--quantization gguf`
    #: keeps in the file by default.
    gguf_in_place: bool = False

    @property
    def is_directory(self) -> bool:
        """True when the model came from a directory or file."""
        return self.source not in MODEL_TYPES

    @property
    def is_real(self) -> bool:
        """True for a real (Llama-shaped) model."""
        return self.transformer is not None

    @property
    def is_encoder(self) -> bool:
        """True for an encoder (BERT): a pooling model without a KV cache."""
        return self.encoder is not None

    @property
    def architecture(self) -> str | None:
        """The Hugging Face architecture of a real model or an encoder."""
        model = self.transformer or self.encoder
        return model.architecture if model is not None else None

    @property
    def is_gguf(self) -> bool:
        """True when the weights are a GGUF file."""
        return self.is_real and self.weights_path is not None

    @property
    def vocab_size(self) -> int:
        """Token ids the model knows."""
        model = self.transformer or self.encoder
        return model.vocab_size if model is not None else BYTE_VOCAB_SIZE

    @property
    def kv_window(self) -> int | None:
        """The sliding window of every layer (`TransformerConfig.kv_window`):
        the KV cache frees what falls out of it; None when a layer reads every key."""
        return self.transformer.kv_window if self.transformer is not None else None

    @property
    def kv_groups(self) -> tuple[int | None, ...]:
        """The window of each KV-cache group (`TransformerConfig.kv_groups`;
        one global group for a model that is not a transformer)."""
        return self.transformer.kv_groups if self.transformer is not None else (None,)

    def kv_group_layers(self) -> list[int]:
        """How many layers each KV-cache group holds (one for a model that is not a transformer)."""
        c = self.transformer
        if c is None:
            return [1]
        counts = [0] * len(c.kv_groups)
        for i in range(c.num_layers):
            counts[c.kv_group(i)] += 1
        return counts

    @property
    def max_position(self) -> int:
        """Longest sequence the model can hold."""
        if self.transformer is not None:
            c = self.transformer
            # A sliding window does not bound it: older keys are out of sight, not out of reach.
            longest = c.max_position_embeddings
            if c.rope_scaling and c.rope_scaling["rope_type"] == "longrope" and not c.rope_scaling.get("long_factor"):
                # Without long factors (a GGUF may leave them out) only the original context is held.
                longest = min(longest, c.rope_scaling["original_max_position_embeddings"])
            return longest
        if self.encoder is not None:
            return self.encoder.max_position_embeddings
        if self.model_type == "toy":
            return int(self.hparams["max_position_embeddings"])
        return 1 << 20


def resolve_model(model: str) -> ModelSpec:
    """The spec for `--model`: `toy`, `echo`, a directory holding
    `config.json` with `"model_type": "toy"|"echo"` or a supported
    architecture with its safetensors, or a `.gguf` file. Raises
    ModelPathError with a message that names the path and what is wrong."""
    if model in MODEL_TYPES:
        return ModelSpec(model, model, dict(TOY_DEFAULTS) if model == "toy" else {})
    if os.path.isfile(model) and model.endswith(".gguf"):
        try:
            info = read_gguf(model)
        except CheckpointError as e:
            raise ModelPathError(f"--model: {e}") from None
        in_place = any(t.type in KERNEL_BLOCKS for t in info.header.tensors.values())
        return ModelSpec(info.config.model_type, os.path.abspath(model), weights_path=os.path.abspath(model),
                         transformer=info.config, gguf_in_place=in_place)  # fmt: skip
    if not os.path.isdir(model):
        raise ModelPathError(
            f"--model {model!r}: not a built-in model ({', '.join(MODEL_TYPES)}), a model directory or a .gguf file"
        )
    config_path = os.path.join(model, CONFIG_FILE)
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise ModelPathError(f"--model {model!r}: the directory has no {CONFIG_FILE}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ModelPathError(f"--model {model!r}: cannot read {CONFIG_FILE}: {e}") from None
    if not isinstance(config, dict):
        raise ModelPathError(f"--model {model!r}: {CONFIG_FILE} is not a JSON object")
    if config.get("model_type") not in MODEL_TYPES:
        return _resolve_real(model, config)
    model_type = config["model_type"]
    hparams = dict(TOY_DEFAULTS) if model_type == "toy" else {}
    unknown = set(config) - set(TOY_DEFAULTS) - {"model_type", "architectures"}
    if model_type == "toy" and unknown:
        raise ModelPathError(f"--model {model!r}: unknown keys in {CONFIG_FILE}: {', '.join(sorted(unknown))}")
    hparams.update({k: v for k, v in config.items() if k in TOY_DEFAULTS})
    weights = os.path.join(model, WEIGHTS_FILE)
    return ModelSpec(model_type, os.path.abspath(model), hparams, weights if os.path.isfile(weights) else None)


def _resolve_real(model: str, config: dict[str, Any]) -> ModelSpec:
    where = os.path.join(model, CONFIG_FILE)
    try:
        encoder = bert_config_from_hf(config, where)
        transformer = None if encoder is not None else config_from_hf(config, where)
        files = safetensors_files(model)
    except CheckpointError as e:
        raise ModelPathError(f"--model: {e}") from None
    tokenizer = model if os.path.isfile(os.path.join(model, "tokenizer.json")) else None
    model_type = (encoder or transformer).model_type
    return ModelSpec(model_type, os.path.abspath(model), transformer=transformer, encoder=encoder, weight_files=files,
                     tokenizer_dir=tokenizer and os.path.abspath(tokenizer))  # fmt: skip


def write_model_dir(path: str, model_type: str = "toy", **hparams: Any) -> str:
    """Writes a model directory's `config.json` (for tests and examples);
    returns `path`."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump({"model_type": model_type, **hparams}, f)
    return path
