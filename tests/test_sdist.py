"""The source distribution holds everything a wheel build from it needs.

Builds the sdist through the project's own PEP 517 backend (build_backend/,
as `python -m build --sdist` or pip would) and checks its file list; nothing is
compiled. Building a wheel from the sdist is a manual check, too slow here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.support.build_backend import run_backend

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent

BUILD_SDIST = """
import vllm_rs_build
print("SDIST=" + vllm_rs_build.build_sdist(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> tuple[str, dict[str, bytes | None]]:
    """(the root folder name, {path under it: content of a few manifests, else None})."""
    maturin = shutil.which(
        "maturin", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
    if maturin is None:
        pytest.skip("maturin is not installed")
    out = tmp_path_factory.mktemp("sdist")
    name = run_backend(BUILD_SDIST, out, "SDIST", bin_dir=Path(maturin).parent)
    assert name.endswith(".tar.gz") and (out / name).is_file()
    files: dict[str, bytes | None] = {}
    with tarfile.open(out / name) as archive:
        roots = {member.name.split("/", 1)[0] for member in archive.getmembers()}
        assert len(roots) == 1, f"an sdist unpacks into one folder, not {sorted(roots)}"
        (root,) = roots
        for member in archive.getmembers():
            if not member.isfile():
                continue
            path = member.name.removeprefix(root + "/")
            keep = path.endswith("Cargo.toml") or path == "pyproject.toml"
            files[path] = archive.extractfile(member).read() if keep else None
    return root, files


def workspace_members() -> list[str]:
    return tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["members"]


def test_sdist_holds_every_workspace_crate(sdist):
    _, files = sdist
    members = workspace_members()
    assert {"rust/core", "rust/python", "frontend-bin"} <= set(members)
    for member in members:
        assert f"{member}/Cargo.toml" in files, member
        tracked = subprocess.run(
            ["git", "ls-files", f"{member}/src"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.split()
        expected = tracked or [str(p.relative_to(ROOT)) for p in (ROOT / member / "src").rglob("*.rs")]
        assert expected, member
        missing = sorted(set(expected) - set(files))
        assert not missing, f"{member} sources missing from the sdist: {missing}"
    assert "Cargo.lock" in files


def test_sdist_workspace_manifest_lists_every_member(sdist):
    """build_wheel runs `cargo build -p vllm-rs` in the unpacked sdist: frontend-bin must stay a member."""
    _, files = sdist
    manifest = tomllib.loads(files["Cargo.toml"].decode())
    assert manifest["workspace"]["members"] == workspace_members()


def test_sdist_holds_the_build_backend(sdist):
    _, files = sdist
    pyproject = tomllib.loads(files["pyproject.toml"].decode())
    backend_path = pyproject["build-system"]["backend-path"]
    backend = pyproject["build-system"]["build-backend"]
    assert backend_path == ["build_backend"]
    assert f"build_backend/{backend}.py" in files
    assert "build_backend/stage_frontend.py" in files
    assert not [path for path in files if path.endswith(".pyc")]


def test_sdist_holds_the_python_package(sdist):
    _, files = sdist
    for path in [
        "__init__.py",
        "_core.pyi",
        "py.typed",
        "utils.py",
        "serving/serve.py",
        "process/core.py",
        "engine/__init__.py",
    ]:
        assert f"python/vllm_rs/{path}" in files, path
    # Built in place by `maturin develop`: never shipped.
    assert not [path for path in files if path.endswith(".so")]


def test_sdist_holds_the_wheel_data(sdist):
    _, files = sdist
    tracked = subprocess.run(
        ["git", "ls-files", "packaging/wheel-data"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.split() or ["packaging/wheel-data/data/share/doc/vllm-rs/README.md"]
    missing = sorted(set(tracked) - set(files))
    assert not missing, f"wheel data missing from the sdist: {missing}"
    # The staged binary (scripts/, ignored by git) is built by build_wheel, never shipped.
    assert "packaging/wheel-data/scripts/vllm-rs" not in files
