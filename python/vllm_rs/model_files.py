"""Where a model's files are, found as vLLM finds them: a local directory as
given, else a snapshot in the Hugging Face hub cache (`HF_HUB_CACHE`, else
`HF_HOME/hub`, else `~/.cache/huggingface/hub`; then `download_dir`) for the
requested revision. Nothing is downloaded: a model in neither place raises
ModelNotFoundError naming it and every place looked in (the Rust frontend's
`model_files.rs` does the same)."""

from __future__ import annotations

import os
from collections.abc import Mapping

#: The revision used when none is given.
DEFAULT_REVISION = "main"


class ModelNotFoundError(LookupError):
    """A model that is neither a directory nor in the hub cache."""


def hub_cache_roots(env: Mapping[str, str] | None = None, download_dir: str | None = None) -> list[str]:
    """The hub cache folders to search, in order: the Hugging Face default
    from the environment, then `download_dir`."""
    env = os.environ if env is None else env
    root = env.get("HF_HUB_CACHE") or None
    if root is None and env.get("HF_HOME"):
        root = os.path.join(env["HF_HOME"], "hub")
    if root is None:
        cache = env.get("XDG_CACHE_HOME") or (os.path.join(env["HOME"], ".cache") if env.get("HOME") else None)
        root = os.path.join(cache, "huggingface", "hub") if cache else None
    return [r for r in (root, download_dir) if r]


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


def locate_model(
    name: str, revision: str | None = None, download_dir: str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """The directory holding `name`'s files: `name` when it is a directory,
    else the cached snapshot of `revision` (default `main`: a branch or tag
    under `refs/`, or a commit under `snapshots/`)."""
    revision = revision or DEFAULT_REVISION
    if os.path.isdir(name):
        return name
    looked = []
    if _plausible(name, revision):
        folder = "models--" + name.replace("/", "--")
        for root in hub_cache_roots(env, download_dir):
            repo = os.path.join(root, folder)
            found = _snapshot(repo, revision)
            if found is not None:
                return found
            looked.append(repo)
    raise ModelNotFoundError(
        f"{name!r} is not a directory and revision {revision!r} of it is not in the Hugging Face cache "
        f"(looked in {', '.join(looked) or 'nothing: not a model name'}); vllm-rs does not download models: "
        "download it first, or pass a directory"
    )
