"""The editable wheel the build backend packs from cargo's output installs a working package.

Packs it from maturin's real metadata and the staged `vllm-rs` executable
(scripts/setup.sh stages it), installs it with pip into a scratch venv, and
checks what an installer relies on: the RECORD hashes, the executable in
bin/, the vLLM plugin entry point, and the `.pth` that imports `vllm_rs` from
the source tree. Nothing is compiled here.
"""

from __future__ import annotations

import base64
import configparser
import csv
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.build_backend import run_backend

ROOT = Path(__file__).resolve().parent.parent
STAGED_BINARY = ROOT / "packaging" / "wheel-data" / "scripts" / "vllm-rs"

PACK_WHEEL = """
import editable_wheel, vllm_rs_build
name = editable_wheel.build_editable_wheel(sys.argv[1], None, vllm_rs_build.prepare_metadata_for_build_editable)
print("WHEEL=" + name)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if not STAGED_BINARY.is_file():
        pytest.skip(f"{STAGED_BINARY} is not staged (scripts/setup.sh stages it)")
    out = tmp_path_factory.mktemp("wheel")
    name = run_backend(PACK_WHEEL, out, "WHEEL", timeout=120)
    return out / name


def test_wheel_record_matches_every_file(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (record_name,) = [name for name in names if name.endswith(".dist-info/RECORD")]
        rows = list(csv.reader(io.StringIO(archive.read(record_name).decode())))
        recorded = {row[0]: row for row in rows}
        assert set(recorded) == set(names)
        for name in names:
            if name == record_name:
                continue
            data = archive.read(name)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert recorded[name][1:] == [f"sha256={digest}", str(len(data))], name
    # Editable: no compiled code and no Python source inside, only the pointer to the tree.
    assert not [name for name in names if name.endswith((".so", ".py"))]
    assert wheel.name.startswith("vllm_rs-0.1.0-") and wheel.name.endswith(".whl")


def test_installed_wheel_runs_from_the_source_tree(wheel, tmp_path):
    # A scratch venv of its own: pip would uninstall the running environment's
    # vllm-rs before installing into a --prefix.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    installed_binary = venv / "bin" / "vllm-rs"
    assert os.access(installed_binary, os.X_OK)
    assert installed_binary.read_bytes() == STAGED_BINARY.read_bytes()
    (site_packages,) = venv.glob("lib/python3*/site-packages")
    assert (site_packages / "vllm_rs.pth").read_text().strip() == str(ROOT / "python")
    (dist_info,) = site_packages.glob("vllm_rs-0.1.0.dist-info")
    entry_points = configparser.ConfigParser()
    entry_points.read_string((dist_info / "entry_points.txt").read_text())
    assert entry_points["vllm.general_plugins"]["vllm_rs"] == "vllm_rs.vllm_patch:register"
    assert (venv / "share" / "doc" / "vllm-rs" / "README.md").is_file()
    # The scratch venv's interpreter imports the package from the source tree
    # (through the .pth) and finds the executable the wheel installed.
    probe = "import vllm_rs; print(vllm_rs.__file__); print(vllm_rs.frontend_binary())"
    imported = subprocess.run(
        [str(python), "-c", probe],
        check=True,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_RS_FRONTEND_PATH")},
        timeout=60,
    )
    assert imported.stdout.splitlines() == [str(ROOT / "python" / "vllm_rs" / "__init__.py"), str(installed_binary)]
