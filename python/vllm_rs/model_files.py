"""Where a model's files are, found as vLLM finds them: a local directory as
given; else a snapshot in the Hugging Face hub cache (`HF_HUB_CACHE`, else
`HF_HOME/hub`, else `~/.cache/huggingface/hub`; then `download_dir`) for the
requested revision; else, unless `HF_HUB_OFFLINE` is set, the tokenizer and
config files are downloaded from the hub (`HF_ENDPOINT`) into the cache with
`huggingface_hub`, as vLLM does. A model found in none of these raises
ModelNotFoundError naming it and every place looked in (the Rust frontend's
`model_files.rs` does the same). The built-in models (`toy`, `echo`) have no
files: they are never looked for or downloaded."""

from __future__ import annotations

import os
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


class ModelNotFoundError(LookupError):
    """A model that is neither a directory, nor in the hub cache, nor downloaded."""


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


def locate_model(
    name: str, revision: str | None = None, download_dir: str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """The directory holding `name`'s files: `name` when it is a directory,
    else the cached snapshot of `revision` (default `main`: a branch or tag
    under `refs/`, or a commit under `snapshots/`), else the snapshot its
    files are downloaded into (to `download_dir` when given, as vLLM does).
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
                return found
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
    return _download(name, revision, into, env, where)
