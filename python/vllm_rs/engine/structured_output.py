"""Structured outputs in the reference engine: the sampling params'
`structured_outputs` map (vLLM 0.33's `StructuredOutputsParams`: one of
`json`, `regex`, `choice`, `grammar`, `json_object`, `structural_tag`) is
compiled with llguidance, as vLLM's `guidance` backend compiles it, against
the byte-level vocabulary; each step the grammar's token mask is applied to
the request's logits and the sampled token is fed back. Once the grammar is
complete only end-of-sequence is allowed."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import numpy as np

from vllm_rs.engine.models import BYTE_EOS_TOKEN_ID, BYTE_VOCAB_SIZE
from vllm_rs.engine.request import InvalidRequestError

#: The constraint keys of vLLM's StructuredOutputsParams (exactly one is set).
CONSTRAINT_KEYS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class _ByteVocabulary:
    """The engine's vocabulary as llguidance's tokenizer wrapper wants it:
    ids 0..255 are the bytes, 256 the (special) end-of-sequence token."""

    eos_token_id = BYTE_EOS_TOKEN_ID
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"\xff<eos>"]
    special_token_ids = [BYTE_EOS_TOKEN_ID]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode())


@cache
def _tokenizer() -> Any:
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocabulary()))


def compile_grammar(params: dict[str, Any]) -> str:
    """The llguidance grammar for a `structured_outputs` map; raises
    InvalidRequestError with vLLM's messages ("Invalid grammar
    specification: ...", "Grammar error: ...") when it cannot be used."""
    import llguidance

    if not isinstance(params, dict):
        raise InvalidRequestError(f"structured_outputs must be a map, got {type(params).__name__}")
    kinds = [key for key in CONSTRAINT_KEYS if params.get(key) is not None]
    if len(kinds) != 1:
        raise InvalidRequestError(
            "You can only use one kind of structured outputs constraint but "
            + ("multiple are specified" if kinds else "none are specified")
            + f": {sorted(kinds)}"
        )
    (kind,) = kinds
    spec = params[kind]
    whitespace = {"whitespace_flexible": not params.get("disable_any_whitespace", False)}
    try:
        if kind == "json":
            schema = json.loads(spec) if isinstance(spec, str) else spec
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=whitespace)
        elif kind == "json_object":
            grammar = llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=whitespace)
        elif kind == "choice":
            if not isinstance(spec, list) or not all(isinstance(c, str) for c in spec):
                raise ValueError("choice must be a list of strings")
            grammar = llguidance.grammar_from("choice", json.dumps(spec))
        elif kind == "structural_tag":
            raise ValueError("structural_tag is not supported by this engine")
        else:
            if not isinstance(spec, str):
                raise ValueError(f"{kind} must be a string")
            grammar = llguidance.grammar_from(kind, spec)
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidRequestError(f"Invalid grammar specification: {e}") from e
    error = llguidance.LLMatcher.validate_grammar(grammar, _tokenizer())
    if error:
        raise InvalidRequestError(f"Grammar error: {error}")
    return grammar


class GrammarMatcher:
    """One request's position in its grammar."""

    def __init__(self, grammar: str):
        import llguidance

        self._matcher = llguidance.LLMatcher(_tokenizer(), grammar)

    def allowed(self, vocab_size: int) -> np.ndarray:
        """Which token ids may come next (a bool array of `vocab_size`)."""
        if self._matcher.is_stopped():
            mask = np.zeros(vocab_size, dtype=bool)
            mask[BYTE_EOS_TOKEN_ID] = True
            return mask
        bits = np.unpackbits(np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        mask = np.zeros(vocab_size, dtype=bool)
        n = min(vocab_size, BYTE_VOCAB_SIZE, bits.shape[0])
        mask[:n] = bits[:n].astype(bool)
        return mask

    def accept(self, token_id: int) -> None:
        """Advances past a sampled token (end-of-sequence after completion is a no-op)."""
        if not self._matcher.is_stopped():
            self._matcher.consume_token(token_id)
