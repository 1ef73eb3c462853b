"""PEP 517 build backend for vllm-rs: maturin, plus the native `vllm-rs` executable.

maturin builds the wheel around the extension module `vllm_rs._core` but
cannot also ship a binary from another crate of the workspace. The wheel hooks
here stage that binary first (`stage_frontend.py`) and then hand over to
maturin, which packs it as a wheel script. Every other hook is maturin's own.
"""

from __future__ import annotations

import maturin
from maturin import (  # noqa: F401  (maturin's own PEP 517 hooks, unchanged)
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
)
from stage_frontend import ensure_wheel_data, stage_frontend_binary


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
    stage_frontend_binary()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)
