"""A GGUF file's header read with `struct` alone: the metadata and the tensor
directory (name, shape, type, byte range). Fast where `gguf.GGUFReader` is
slow (it turns every vocabulary entry into a numpy view): arrays are skipped
and kept as `GgufArray(type, count, offset)` unless asked for."""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
#: GGUF metadata value types -> struct format (fixed-size ones).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
#: ggml tensor type id -> (name, elements per block, bytes per block), for
#: the types the loader reads (the `gguf` package dequantizes each of them);
#: others are reported by id and name.
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
}
#: ggml type id -> weights per block, for the types the Rust kernel
#: (`_core.gguf_matmul`) reads in place: its `QuantType`s, F16 and BF16 in
#: groups of 32.
KERNEL_BLOCKS = {1: 32, 2: 32, 3: 32, 6: 32, 7: 32, 8: 32, 20: 32, 30: 32,
                 10: 256, 11: 256, 12: 256, 13: 256, 14: 256, 23: 256}  # fmt: skip
#: Names of other ggml types, for error messages.
OTHER_GGML_TYPES = {9: "Q8_1", 15: "Q8_K", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 39: "MXFP4"}


class GgufFormatError(ValueError):
    """The bytes are not a whole GGUF file (names what is wrong)."""


@dataclass(frozen=True)
class GgufArray:
    """A metadata array not read: its element type, length and where it starts."""

    type: int
    count: int
    offset: int


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of the directory: `shape` in PyTorch order (rows last
    in GGUF's `ne`), its ggml type id and its absolute byte range."""

    name: str
    shape: tuple[int, ...]
    type: int
    offset: int

    @property
    def type_name(self) -> str:
        """The ggml type's name (`Q4_K`, ...)."""
        known = GGML_TYPES.get(self.type)
        return known[0] if known else OTHER_GGML_TYPES.get(self.type, f"type {self.type}")

    @property
    def num_elements(self) -> int:
        """Elements of the tensor."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def num_bytes(self) -> int:
        """Bytes of its data (only for the supported types)."""
        _, block, size = GGML_TYPES[self.type]
        return self.num_elements // block * size


@dataclass
class GgufHeader:
    """The metadata and tensor directory of a GGUF file."""

    metadata: dict[str, Any]
    tensors: dict[str, GgufTensor]
    file_size: int


class _Cursor:
    def __init__(self, data: mmap.mmap | bytes):
        self.data = data
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.data, self.pos)
        except struct.error:
            raise GgufFormatError(f"the header ends early (at byte {self.pos})") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.pos + n > len(self.data):
            raise GgufFormatError(f"the header ends early (a string at byte {self.pos})")
        raw = self.data[self.pos : self.pos + n]
        self.pos += n
        return bytes(raw).decode("utf-8", errors="replace")

    def value(self, kind: int, read_arrays: bool) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise GgufFormatError(f"unknown metadata value type {kind} at byte {self.pos}")
        elem, count = self.unpack("<I"), self.unpack("<Q")
        start = self.pos
        if read_arrays:
            return [self.value(elem, True) for _ in range(count)]
        if elem in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[elem])
        elif elem == _STRING:
            self._skip_strings(count)
        else:
            for _ in range(count):
                self.value(elem, False)
        return GgufArray(elem, count, start)

    def _skip_strings(self, count: int) -> None:
        # Lengths only, nothing decoded: a vocabulary is ~100k strings, and
        # decoding each one tripled the time of reading a header.
        data, pos, end, length = self.data, self.pos, len(self.data), struct.Struct("<Q")
        for _ in range(count):
            if pos + 8 > end:
                raise GgufFormatError(f"the header ends early (a string at byte {pos})")
            pos += 8 + length.unpack_from(data, pos)[0]
        if pos > end:
            raise GgufFormatError(f"the header ends early (a string array ending at byte {pos})")
        self.pos = pos


#: Headers read without their arrays, by the file's identity (real path,
#: size, modification time): an engine reads one file's header for its
#: config, its weights and its embeddings, and walking the vocabulary's
#: ~100k strings costs about 0.3 s each time.
_HEADERS: dict[tuple[str, int, int], GgufHeader] = {}


def read_header(path: str, read_arrays: bool = False) -> GgufHeader:
    """The header of the GGUF file at `path` (shared between calls when
    `read_arrays` is False: not to be modified); raises GgufFormatError (not
    GGUF, an unsupported version, a header that ends early) or OSError."""
    if read_arrays:
        return _parse_header(path, True)
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    header = _HEADERS.get(key)
    if header is None:
        header = _HEADERS[key] = _parse_header(path, False)
    return header


def _parse_header(path: str, read_arrays: bool) -> GgufHeader:
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise GgufFormatError(f"not a GGUF file ({size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            cursor = _Cursor(data)
            if bytes(data[:4]) != GGUF_MAGIC:
                raise GgufFormatError("not a GGUF file (no GGUF magic)")
            cursor.pos = 4
            version = cursor.unpack("<I")
            if version not in (2, 3):
                raise GgufFormatError(f"GGUF version {version} is not supported (2 or 3)")
            num_tensors, num_kv = cursor.unpack("<Q"), cursor.unpack("<Q")
            metadata: dict[str, Any] = {}
            for _ in range(num_kv):
                key = cursor.string()
                metadata[key] = cursor.value(cursor.unpack("<I"), read_arrays)
            infos = []
            for _ in range(num_tensors):
                name = cursor.string()
                dims = [cursor.unpack("<Q") for _ in range(cursor.unpack("<I"))]
                infos.append((name, tuple(reversed(dims)), cursor.unpack("<I"), cursor.unpack("<Q")))
            alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
            start = -(-cursor.pos // alignment) * alignment
    tensors = {name: GgufTensor(name, shape, kind, start + offset) for name, shape, kind, offset in infos}
    return GgufHeader(metadata, tensors, size)
