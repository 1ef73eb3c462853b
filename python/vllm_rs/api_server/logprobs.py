"""Logprobs in the API server: read from engine outputs (vLLM's
`LogprobsLists` / `LogprobsTensors`, arrays inline as msgpack extension 3 or
in aux frames), grouped per position as vLLM's `LogprobsProcessor` groups them
(the scored token first, then the top k, a token listed twice kept once at its
first place with its last values), and rendered as vLLM 0.33's completions
and chat endpoints render them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from vllm_rs.engine.logprobs import LogprobsRows

#: vLLM's msgpack extension code for an inline raw array buffer.
RAW_VIEW_EXT = 3
#: What OpenAI (and vLLM) write for a logprob of -inf.
MIN_LOGPROB = -9999.0
#: The dtype each array may have on the wire: numpy's names (LogprobsLists)
#: or torch's (LogprobsTensors).
_DTYPES = (
    {"<i4": np.int32, "int32": np.int32, "<i8": np.int64, "int64": np.int64},
    {"<f4": np.float32, "float32": np.float32, "<f2": np.float16, "float16": np.float16, "bfloat16": None},
    {"<i8": np.int64, "int64": np.int64, "<i4": np.int32, "int32": np.int32},
)


@dataclass
class LogprobRows:
    """Scored positions of one output: `token_ids` and `logprobs` are
    `rows x (k + 1)` lists (column 0 the scored token), `ranks` the scored
    token's rank per row."""

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]

    @classmethod
    def of(cls, rows: LogprobsRows) -> LogprobRows:
        """The rows an engine output carried, as lists."""
        return cls(rows.token_ids.tolist(), rows.logprobs.astype(np.float64).tolist(), rows.ranks.tolist())

    def __len__(self) -> int:
        return len(self.ranks)

    def head(self, count: int) -> LogprobRows:
        """The first `count` rows."""
        return LogprobRows(self.token_ids[:count], self.logprobs[:count], self.ranks[:count])


#: One scored token: (logprob, rank, the token decoded as vLLM decodes it).
Logprob = tuple[float, int, str]
#: One position: token id -> its Logprob, the scored token first.
Position = dict[int, Logprob]
#: Decodes token ids to text (special tokens kept, bad UTF-8 as U+FFFD).
Decode = Callable[[list[int]], str]


class PositionReader:
    """Turns rows into positions as vLLM's `LogprobsProcessor` does: ranks
    are the scored token's, then 1..k; a token listed twice keeps its first
    place with its last values; each token is decoded alone, and one whose
    text ends in U+FFFD (part of a UTF-8 character) is decoded again after
    the scored tokens before it (up to 4) and shows only what it adds, or
    nothing. One reader per request and kind (sample or prompt): it keeps
    the scored tokens as context."""

    def __init__(self, decode: Decode):
        self.decode = decode
        self.context: list[int] = []

    def read(self, rows: LogprobRows) -> list[Position]:
        """The positions of `rows`, in order."""
        positions = []
        for token_ids, logprobs, rank in zip(rows.token_ids, rows.logprobs, rows.ranks):
            context = self.context[-4:]
            texts = [self._text(t, context) for t in token_ids]
            ranks = [rank, *range(1, len(token_ids))]
            positions.append({t: (lp, r, x) for t, lp, r, x in zip(token_ids, logprobs, ranks, texts)})
            if token_ids:
                self.context.append(token_ids[0])
        return positions

    def _text(self, token_id: int, context: list[int]) -> str:
        text = self.decode([token_id])
        if not text.endswith("\ufffd"):
            return text
        # vLLM's _correct_decoded_token.
        for size in range(1, len(context) + 1):
            tail = context[-size:]
            whole = self.decode([*tail, token_id])
            if whole.endswith("\ufffd"):
                continue
            clean_end = len(tail)
            for j in range(len(tail) - 1, -1, -1):
                if not self.decode([tail[j]]).endswith("\ufffd"):
                    break
                clean_end = j
            prefix = self.decode(tail[:clean_end]) if clean_end > 0 else ""
            if whole.startswith(prefix):
                return whole[len(prefix) :]
            common = 0
            for a, b in zip(prefix, whole):
                if a != b:
                    break
                common += 1
            return whole[common:]
        return ""


def _array(value: Any, frames: Sequence[bytes | memoryview], dtypes: dict[str, Any], what: str) -> np.ndarray:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ValueError(f"{what} is not (dtype, shape, data)")
    dtype_name, shape, data = value
    if dtype_name not in dtypes:
        raise ValueError(f"{what} has dtype {dtype_name!r:.40}, expected one of {sorted(dtypes)}")
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"{what} has no valid shape")
    if isinstance(data, msgpack.ExtType) and data.code == RAW_VIEW_EXT:
        raw: bytes | memoryview = data.data
    elif isinstance(data, int) and not isinstance(data, bool) and 1 <= data < len(frames):
        raw = frames[data]
    else:
        raise ValueError(f"{what} data is neither inline (extension 3) nor an aux frame index")
    dtype = dtypes[dtype_name]
    if dtype is None:  # bfloat16: the high half of a float32
        halves = np.frombuffer(raw, dtype=np.uint16) if len(raw) % 2 == 0 else None
        if halves is None:
            raise ValueError(f"{what} data does not fit its shape")
        array = (halves.astype(np.uint32) << 16).view(np.float32)
    else:
        if len(raw) % np.dtype(dtype).itemsize:
            raise ValueError(f"{what} data does not fit its shape")
        array = np.frombuffer(raw, dtype=dtype)
    if array.size != math.prod(shape):
        raise ValueError(f"{what} data does not fit its shape")
    return array.reshape(shape)


def read_rows(value: Any, frames: Sequence[bytes | memoryview], what: str) -> LogprobsRows:
    """One `LogprobsLists` or `LogprobsTensors` (`frames` the message's, for
    arrays in aux frames); ValueError naming `what` when it breaks the layout."""
    if not isinstance(value, (list, tuple)) or len(value) < 3:
        raise ValueError(f"{what} is not (token_ids, logprobs, ranks, ...)")
    ids, lps, ranks = (_array(v, frames, d, f"{what}[{i}]") for i, (v, d) in enumerate(zip(value[:3], _DTYPES)))
    if ids.ndim != 2 or lps.shape != ids.shape or ranks.shape != (ids.shape[0],):
        raise ValueError(f"{what} arrays have mismatched shapes")
    if ids.size and (ids.min() < 0 or ids.max() > 2**32 - 1):
        raise ValueError(f"{what} holds a token id out of range")
    return LogprobsRows(ids, lps, ranks)


def token_id_placeholder(token_id: int) -> str:
    """vLLM's `token_id:N` (with `return_tokens_as_token_ids`)."""
    return f"token_id:{token_id}"


def clamp(logprob: float) -> float:
    """-inf as the JSON-writable number OpenAI uses."""
    return max(logprob, MIN_LOGPROB)


@dataclass(frozen=True)
class TokenStrings:
    """How logprobs show tokens: as vLLM decodes them, or as `token_id:N`
    (`return_tokens_as_token_ids`); a token without a position (the first
    prompt token) is decoded alone."""

    decode: Decode
    as_ids: bool = False

    def of(self, token_id: int, position: Position | None) -> str:
        """The string for `token_id`, scored at `position`."""
        if self.as_ids:
            return token_id_placeholder(token_id)
        entry = None if position is None else position.get(token_id)
        return self.decode([token_id]) if entry is None else entry[2]


def completion_logprobs(
    token_ids: Sequence[int],
    positions: Sequence[Position | None],
    num_logprobs: int,
    strings: TokenStrings,
    initial_text_offset: int = 0,
) -> dict[str, Any]:
    """vLLM's `_create_completion_logprobs`: a position without logprobs
    (the first prompt token) has None; each `top_logprobs` holds the first
    `logprobs + 1` entries (all of them for -1)."""
    limit = None if num_logprobs == -1 else max(num_logprobs + 1, 0)
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for token_id, position in zip(token_ids, positions):
        offsets.append(initial_text_offset if not offsets else offsets[-1] + len(tokens[-1]))
        tokens.append(strings.of(token_id, position))
        if position is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
        else:
            token_logprobs.append(clamp(position[token_id][0]))
            entries = list(position.items())[:limit]
            top_logprobs.append({strings.of(t, position): clamp(lp) for t, (lp, _, _) in entries})
    return {"text_offset": offsets, "token_logprobs": token_logprobs, "tokens": tokens, "top_logprobs": top_logprobs}


def _utf8(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat_logprobs(
    token_ids: Sequence[int], positions: Sequence[Position | None], top_logprobs: int, strings: TokenStrings
) -> dict[str, Any]:
    """vLLM's `_create_chat_logprobs`: per token {token, logprob, bytes,
    top_logprobs}, the first `top_logprobs` entries of each position (all of
    them for -1). As in vLLM, a token's own `bytes` are those of its decoded
    text even when it is shown as `token_id:N`."""
    limit = None if top_logprobs == -1 else top_logprobs
    content = []
    for token_id, position in zip(token_ids, positions):
        token = strings.of(token_id, position)
        if position is None or token_id not in position:
            content.append({"token": token, "logprob": MIN_LOGPROB, "bytes": _utf8(token), "top_logprobs": []})
            continue
        top = [
            {"token": (text := strings.of(t, position)), "logprob": clamp(lp), "bytes": _utf8(text)}
            for t, (lp, _, _) in list(position.items())[:limit]
        ]
        logprob, _, decoded = position[token_id]
        content.append({"token": token, "logprob": clamp(logprob), "bytes": _utf8(decoded), "top_logprobs": top})
    return {"content": content}


def prompt_logprobs_json(positions: Sequence[Position | None]) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs` field: per prompt token None (the first) or
    {token id: {logprob, rank, decoded_token}}, -inf clamped."""
    return [
        None
        if position is None
        else {
            str(t): {"logprob": clamp(lp), "rank": rank, "decoded_token": text}
            for t, (lp, rank, text) in position.items()
        }
        for position in positions
    ]
