"""Prefix-cache block hashes: SHA-256 over the parent block's hash (or the
request's cache salt for the first block) and the block's token ids, read as
bytes through `vllm_rs.tensor_utils.tensor_data` (no copy for the contiguous
CPU tensor)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from vllm_rs.tensor_utils import tensor_data


def hash_block_tokens(parent_hash: bytes | None, token_ids: Sequence[int], cache_salt: str | None = None) -> bytes:
    """The hash of one full block given everything before it."""
    digest = hashlib.sha256()
    if parent_hash is not None:
        digest.update(parent_hash)
    elif cache_salt:
        digest.update(cache_salt.encode())
    digest.update(tensor_data(torch.tensor(token_ids, dtype=torch.int64)))
    return digest.digest()
