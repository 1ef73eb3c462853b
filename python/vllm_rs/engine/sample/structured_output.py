"""Structured outputs in the reference engine: the sampling params'
`structured_outputs` map (vLLM 0.33's `StructuredOutputsParams`: one of
`json`, `regex`, `choice`, `grammar`, `json_object`, `structural_tag`) is
compiled with llguidance, as vLLM's `guidance` backend compiles it, against
the model's vocabulary (its `tokenizer.json` when it has one, else the
byte-level vocabulary of `toy`); each step the grammar's token mask is
applied to the request's logits and the sampled token is fed back. Once the
grammar is complete only end-of-sequence is allowed."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from vllm_rs.engine.model_loader.registry import BYTE_EOS_TOKEN_ID, BYTE_VOCAB_SIZE
from vllm_rs.engine.sched.request import InvalidRequestError

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


@dataclass(frozen=True)
class GrammarVocabulary:
    """A model's vocabulary as grammars see it: llguidance's tokenizer over
    the logits' `vocab_size` ids, and the ids that end a sequence."""

    tokenizer: Any
    vocab_size: int
    eos_token_ids: tuple[int, ...]


@cache
def byte_vocabulary() -> GrammarVocabulary:
    """The byte-level vocabulary of the built-in models."""
    import llguidance

    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocabulary()))
    return GrammarVocabulary(tokenizer, BYTE_VOCAB_SIZE, (BYTE_EOS_TOKEN_ID,))


def _eos_ids(tokenizer_dir: str, token_to_id: Any) -> list[int]:
    """The end-of-sequence ids: `generation_config.json`'s `eos_token_id`
    (one or a list), plus `tokenizer_config.json`'s `eos_token`."""
    ids: list[int] = []
    for name in ("generation_config.json", "tokenizer_config.json"):
        try:
            with open(os.path.join(tokenizer_dir, name), encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(config, dict):
            continue
        eos = config.get("eos_token_id") if name == "generation_config.json" else config.get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        for value in eos if isinstance(eos, list) else [eos]:
            token = token_to_id(value) if isinstance(value, str) else value
            if isinstance(token, int) and not isinstance(token, bool):
                ids.append(token)
    return list(dict.fromkeys(ids))


@cache
def tokenizer_vocabulary(tokenizer_dir: str, vocab_size: int) -> GrammarVocabulary:
    """The vocabulary of the `tokenizer.json` in `tokenizer_dir`, over
    `vocab_size` logits (a model may have more logits than tokens); built
    once per engine (about a second for a 150k vocabulary)."""
    import llguidance
    from tokenizers import Tokenizer

    with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
        text = f.read()
    eos = _eos_ids(tokenizer_dir, Tokenizer.from_str(text).token_to_id)
    tokenizer = llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=eos or None)
    return GrammarVocabulary(tokenizer, vocab_size, tuple(eos or tokenizer.eos_tokens))


def grammar_vocabulary(tokenizer_dir: str | None, vocab_size: int) -> GrammarVocabulary:
    """The model's tokenizer's vocabulary when it has one, else the byte-level one."""
    return tokenizer_vocabulary(tokenizer_dir, vocab_size) if tokenizer_dir else byte_vocabulary()


def compile_grammar(params: dict[str, Any], vocabulary: GrammarVocabulary | None = None) -> str:
    """The llguidance grammar for a `structured_outputs` map, checked against
    `vocabulary` (default: the byte-level one); raises
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
    error = llguidance.LLMatcher.validate_grammar(grammar, (vocabulary or byte_vocabulary()).tokenizer)
    if error:
        raise InvalidRequestError(f"Grammar error: {error}")
    return grammar


class GrammarMatcher:
    """One request's position in its grammar."""

    def __init__(self, grammar: str, vocabulary: GrammarVocabulary | None = None):
        import llguidance

        self._vocabulary = vocabulary or byte_vocabulary()
        self._matcher = llguidance.LLMatcher(self._vocabulary.tokenizer, grammar)

    def allowed(self, vocab_size: int) -> np.ndarray:
        """Which token ids may come next (a bool array of `vocab_size`)."""
        mask = np.zeros(vocab_size, dtype=bool)
        if self._matcher.is_stopped():
            mask[[i for i in self._vocabulary.eos_token_ids if i < vocab_size]] = True
            return mask
        bits = np.unpackbits(np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        n = min(vocab_size, self._vocabulary.vocab_size, bits.shape[0])
        mask[:n] = bits[:n].astype(bool)
        return mask

    def accept(self, token_id: int) -> None:
        """Advances past a sampled token (end-of-sequence after completion is a no-op)."""
        if not self._matcher.is_stopped():
            self._matcher.consume_token(token_id)
