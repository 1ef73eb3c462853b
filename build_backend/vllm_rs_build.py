"""PEP 517 build backend for vllm-rs: maturin, plus the native `vllm-rs` executable.

maturin builds the wheel around the extension module `vllm_rs._core` but
cannot also ship a binary from another crate of the workspace. The wheel hook
here stages that binary first (`stage_frontend.py`) and then hands over to
maturin, which packs it as a wheel script. The editable hook (`pip install -e`,
what `scripts/setup.sh` runs) builds the binary and the extension in one cargo
invocation and packs the editable wheel itself (`editable_wheel.py`): maturin
would compile the extension again, on its own feature set. The sdist hook
undoes maturin's pruning of the workspace (see `build_sdist`). Every other hook
is maturin's own.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile

import maturin
from editable_wheel import build_editable_wheel
from maturin import (  # noqa: F401  (maturin's own PEP 517 hooks, unchanged)
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
)
from stage_frontend import (
    ROOT,
    cargo_build,
    ensure_wheel_data,
    install_extension_in_place,
    stage_binary,
    stage_frontend_binary,
)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    ensure_wheel_data()
    return maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    ensure_wheel_data()
    return maturin.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    stage_frontend_binary()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """The binary and the extension from one cargo build; the extension goes into python/vllm_rs."""
    release_dir = cargo_build(with_extension=True)
    stage_binary(release_dir)
    install_extension_in_place(release_dir)
    return build_editable_wheel(wheel_directory, metadata_directory, prepare_metadata_for_build_editable)


def build_sdist(sdist_directory, config_settings=None):
    """maturin's sdist, with the workspace manifest (`Cargo.toml`) of the source tree.

    maturin cuts `[workspace] members` down to the extension crate and its path
    dependencies, which drops `frontend-bin`: the sdist still ships that crate
    (`include` in pyproject.toml), but `build_wheel` could not build `vllm-rs`
    from it. So the sdist's root Cargo.toml is swapped back for the tree's own.
    """
    filename = maturin.build_sdist(sdist_directory, config_settings)
    _restore_workspace_manifest(os.path.join(sdist_directory, filename))
    return filename


def _restore_workspace_manifest(sdist_path: str) -> None:
    """Rewrites the sdist with ROOT/Cargo.toml in place of its `<name>-<version>/Cargo.toml`."""
    manifest = (ROOT / "Cargo.toml").read_bytes()
    rewritten = io.BytesIO()
    # mtime=0 keeps the gzip header, like maturin's archive, reproducible.
    with (
        tarfile.open(sdist_path, "r:gz") as source,
        gzip.GzipFile(fileobj=rewritten, mode="wb", mtime=0) as packed,
        tarfile.open(fileobj=packed, mode="w", format=source.format) as target,
    ):
        for member in source.getmembers():
            data = source.extractfile(member) if member.isfile() else None
            if member.isfile() and member.name.count("/") == 1 and member.name.endswith("/Cargo.toml"):
                member.size = len(manifest)
                data = io.BytesIO(manifest)
            target.addfile(member, data)
    with open(sdist_path, "wb") as out:
        out.write(rewritten.getvalue())
