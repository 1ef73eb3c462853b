"""Prefix-cache block hashes: SHA-256 over the parent block's hash (or the
request's cache salt for the first block) and the block's token ids as
little-endian int64 bytes (the bytes of the int64 tensor vLLM's utils hash,
`vllm_rs.tensor_utils.tensor_data`, without importing torch)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def hash_block_tokens(parent_hash: bytes | None, token_ids: Sequence[int], cache_salt: str | None = None) -> bytes:
    """The hash of one full block given everything before it."""
    digest = hashlib.sha256()
    if parent_hash is not None:
        digest.update(parent_hash)
    elif cache_salt:
        digest.update(cache_salt.encode())
    digest.update(np.asarray(token_ids, dtype="<i8").tobytes())
    return digest.digest()
