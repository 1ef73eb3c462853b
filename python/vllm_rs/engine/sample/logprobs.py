"""Logprobs as vLLM 0.33's engine returns them: for each scored position, the
scored token first, then the top `k` tokens, with their log-probabilities and
the scored token's rank (1 = most likely; ties count as better, as vLLM's
`batched_count_greater_than` does).

Sample logprobs travel as `LogprobsLists` (numpy arrays) in an output's
`new_logprobs` slot, prompt logprobs as `LogprobsTensors` (torch tensors) in
`new_prompt_logprobs_tensors`; both are encoded the way vLLM's
`MsgpackEncoder` encodes arrays: `(dtype, shape, data)`, the data inline as
msgpack extension 3 (vLLM's raw view, which its decoder accepts at any size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

#: vLLM's msgpack extension code for an inline raw array buffer.
RAW_VIEW_EXT = 3
#: numpy dtypes vLLM uses: int32 ids, float32 logprobs, int64 ranks.
_TOKEN_IDS, _LOGPROBS, _RANKS = np.dtype("<i4"), np.dtype("<f4"), np.dtype("<i8")


def num_columns(requested: int, vocab_size: int) -> int:
    """How many top tokens a request asking for `requested` gets: -1 means
    the whole vocabulary (as vLLM allows), else at most the vocabulary."""
    return vocab_size if requested == -1 else min(requested, vocab_size)


@dataclass
class LogprobsRows:
    """Scored positions of one request: `token_ids` and `logprobs` are
    `[rows, k + 1]` (column 0 the scored token), `ranks` is `[rows]`."""

    token_ids: np.ndarray
    logprobs: np.ndarray
    ranks: np.ndarray

    def __post_init__(self) -> None:
        self.token_ids = np.ascontiguousarray(self.token_ids, dtype=_TOKEN_IDS)
        self.logprobs = np.ascontiguousarray(self.logprobs, dtype=_LOGPROBS)
        self.ranks = np.ascontiguousarray(self.ranks, dtype=_RANKS)

    @property
    def num_rows(self) -> int:
        """Number of scored positions."""
        return int(self.ranks.shape[0])

    @classmethod
    def concat(cls, parts: list[LogprobsRows]) -> LogprobsRows:
        """The rows of `parts`, in order (all with the same width)."""
        return cls(
            np.concatenate([p.token_ids for p in parts]),
            np.concatenate([p.logprobs for p in parts]),
            np.concatenate([p.ranks for p in parts]),
        )

    def to_lists_wire(self) -> list[Any]:
        """vLLM's `LogprobsLists` (numpy arrays, no `cu_num_generated_tokens`)."""
        return [_ndarray(self.token_ids), _ndarray(self.logprobs), _ndarray(self.ranks), None]

    def to_tensors_wire(self) -> list[Any]:
        """vLLM's `LogprobsTensors` (torch tensors, dtypes by torch's names)."""
        return [
            _tensor(self.token_ids, "int32"),
            _tensor(self.logprobs, "float32"),
            _tensor(self.ranks, "int64"),
            None,
            None,
        ]

    @classmethod
    def from_wire(cls, items: Any) -> LogprobsRows:
        """Reads either wire form (inline data only, as this engine writes it)."""
        arrays = []
        for (_, shape, data), dtype in zip(items[:3], (_TOKEN_IDS, _LOGPROBS, _RANKS), strict=True):
            raw = data.data if isinstance(data, msgpack.ExtType) else data
            arrays.append(np.frombuffer(raw, dtype=dtype).reshape(shape))
        return cls(*arrays)


def _ndarray(array: np.ndarray) -> list[Any]:
    return [array.dtype.str, list(array.shape), msgpack.ExtType(RAW_VIEW_EXT, array.tobytes())]


def _tensor(array: np.ndarray, torch_dtype: str) -> list[Any]:
    return [torch_dtype, list(array.shape), msgpack.ExtType(RAW_VIEW_EXT, array.tobytes())]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """The log-probabilities of each row of float32 `logits` `[rows, vocab]`."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def gather(logprobs: np.ndarray, token_ids: Any, k: int) -> LogprobsRows:
    """vLLM's `gather_logprobs` for `logprobs` `[rows, vocab]` (float32) and
    the scored `token_ids` `[rows]`: the scored token's logprob and rank,
    then the top `k` (by logprob, ties by token id)."""
    token_ids = np.asarray(token_ids, dtype=np.int64)[:, None]
    scored = np.take_along_axis(logprobs, token_ids, axis=-1)
    ranks = (logprobs >= scored).sum(-1)
    vocab = logprobs.shape[-1]
    if k < vocab:
        top_ids = np.argpartition(-logprobs, k - 1, axis=-1)[:, :k] if k else np.empty((len(logprobs), 0), np.int64)
        top_values = np.take_along_axis(logprobs, top_ids, axis=-1)
        order = np.lexsort((top_ids, -top_values), axis=-1)
        top_ids = np.take_along_axis(top_ids, order, axis=-1)
    else:
        top_ids = np.argsort(-logprobs, axis=-1, kind="stable")
    top_values = np.take_along_axis(logprobs, top_ids, axis=-1)
    return LogprobsRows(
        np.concatenate((token_ids, top_ids), axis=1),
        np.concatenate((scored, top_values), axis=1),
        ranks,
    )


def echo_rows(targets: list[int], k: int, vocab_size: int) -> LogprobsRows:
    """The echo model's deterministic distribution: at a position whose
    token is `t`, token `(t + i) % vocab_size` has probability 2**-(i + 1)
    (the last one takes the remainder, so they sum to 1). The scored token is
    `t`: logprob -ln 2, rank 1; the top `k` are `t, t+1, ...`."""
    offsets = np.arange(k)
    logprob_of_offset = -(np.minimum(offsets, vocab_size - 2) + 1) * math.log(2)
    rows = len(targets)
    t = np.asarray(targets, dtype=np.int64)[:, None]
    token_ids = np.concatenate([t, (t + offsets[None, :]) % vocab_size], axis=1)
    logprobs = np.concatenate([np.full((rows, 1), -math.log(2)), np.broadcast_to(logprob_of_offset, (rows, k))], axis=1)
    return LogprobsRows(token_ids, logprobs, np.ones(rows))
