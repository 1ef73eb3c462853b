"""Packs the editable wheel of vllm-rs from what cargo built, without maturin compiling.

An editable install needs no compiled code inside the wheel: the extension
module lives in the source tree (`python/vllm_rs/_core*.so`, as
`maturin develop` leaves it) and a `.pth` file puts `python/` on sys.path.
The wheel holds that `.pth`, maturin's metadata (`METADATA`, `WHEEL`,
`entry_points.txt`, written without building anything), and the wheel data:
the staged `vllm-rs` executable and the files under `packaging/wheel-data/data`.
"""

from __future__ import annotations

import base64
import hashlib
import tempfile
import zipfile
from pathlib import Path

from stage_frontend import ROOT, STAGED_BINARY, WHEEL_DATA

PYTHON_SOURCE = ROOT / "python"
PTH_NAME = "vllm_rs.pth"


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _wheel_tag(dist_info: Path) -> str:
    """The first `Tag:` of the WHEEL file, e.g. `cp311-cp311-linux_x86_64`."""
    for line in (dist_info / "WHEEL").read_text().splitlines():
        if line.startswith("Tag:"):
            return line.split(":", 1)[1].strip()
    raise ValueError(f"{dist_info / 'WHEEL'} names no wheel tag")


def _wheel_data_files() -> list[tuple[str, Path]]:
    """(path inside `<name>.data/`, file) for the staged binary and the data files."""
    if not STAGED_BINARY.is_file():
        raise FileNotFoundError(f"{STAGED_BINARY} is not staged: build the frontend binary first")
    files = [(f"scripts/{STAGED_BINARY.name}", STAGED_BINARY)]
    data_dir = WHEEL_DATA / "data"
    files += [(f"data/{path.relative_to(data_dir).as_posix()}", path) for path in sorted(data_dir.rglob("*"))]
    return [(arcname, path) for arcname, path in files if path.is_file()]


def write_editable_wheel(wheel_directory: str, dist_info: Path) -> str:
    """Writes the editable wheel into wheel_directory from the metadata in dist_info; returns its file name."""
    name, _, version = dist_info.name.removesuffix(".dist-info").partition("-")
    filename = f"{name}-{version}-{_wheel_tag(dist_info)}.whl"
    entries: list[tuple[str, bytes, int]] = [(PTH_NAME, f"{PYTHON_SOURCE}\n".encode(), 0o644)]
    for arcname, path in _wheel_data_files():
        entries.append((f"{name}-{version}.data/{arcname}", path.read_bytes(), path.stat().st_mode & 0o777))
    for path in sorted(dist_info.rglob("*")):
        if path.is_file() and path.name != "RECORD":
            entries.append((f"{dist_info.name}/{path.relative_to(dist_info).as_posix()}", path.read_bytes(), 0o644))
    record_name = f"{dist_info.name}/RECORD"
    record = "".join(f"{_record_line(arcname, data)}\n" for arcname, data, _ in entries) + f"{record_name},,\n"
    entries.append((record_name, record.encode(), 0o644))
    with zipfile.ZipFile(Path(wheel_directory) / filename, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for arcname, data, mode in entries:
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16  # a regular file with these permissions
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return filename


def build_editable_wheel(wheel_directory: str, metadata_directory: str | None, prepare_metadata) -> str:
    """The editable wheel, with the metadata pip prepared or, without one, prepare_metadata(dir)'s."""
    if metadata_directory is not None:
        dist_infos = sorted(Path(metadata_directory).glob("*.dist-info"))
        if dist_infos:
            return write_editable_wheel(wheel_directory, dist_infos[0])
    with tempfile.TemporaryDirectory() as scratch:
        dist_info = Path(scratch) / prepare_metadata(scratch)
        return write_editable_wheel(wheel_directory, dist_info)
