"""Gemma's SentencePiece tokenizer rebuilt from a GGUF's vocabulary (a
`tokenizers.Tokenizer`, as transformers builds it from the same file): BPE
with byte fallback over `tokenizer.ggml.tokens`, spaces written as `▁` by a
normalizer, and merges derived from the vocabulary, which the GGUF does not
list. Used by `gguf_tokenizer` for `tokenizer.ggml.model` = `llama` files of
the Gemma architectures."""

from __future__ import annotations

from typing import Any

#: `general.architecture` values whose `llama` vocabulary is Gemma's.
GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")

_SPACE = "\u2581"


def gemma_tokens(tokens: list[str]) -> list[str]:
    """The vocabulary as Gemma's tokenizer spells it: llama.cpp's converter
    writes the tokens made of runs of spaces with real spaces, where the
    tokenizer (whose normalizer turns every space into `▁`) looks them up
    as runs of `▁`."""
    return [_SPACE * len(t) if t and not t.strip(" ") else t for t in tokens]


def merges_by_position(tokens: list[str]) -> list[tuple[str, str]]:
    """BPE merges recovered from a vocabulary: every split of a token into
    two tokens, ranked by the token's position (an earlier token merges
    first: Gemma's vocabulary is in merge order, unlike its scores), then
    longer left part first, as transformers' `generate_merges` ranks them."""
    ids = {token: i for i, token in enumerate(tokens)}
    return [
        (token[:k], token[k:])
        for token in tokens
        for k in range(len(token) - 1, 0, -1)
        if token[:k] in ids and token[k:] in ids
    ]


def build_gemma_tokenizer(tokens: list[str], unk_token: str | None) -> Any:
    """A `tokenizers.Tokenizer` (model, normalizer and decoder; the caller
    adds the special tokens and BOS) for Gemma's vocabulary `tokens` as
    the GGUF lists them."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    spelled = gemma_tokens(tokens)
    ids = {token: i for i, token in enumerate(spelled)}
    model = models.BPE(
        ids, merges_by_position(spelled), unk_token=unk_token, fuse_unk=True, byte_fallback=True
    )  # fmt: skip
    tokenizer = Tokenizer(model)
    # No pre-tokenizer: the text is one piece with its spaces as `▁`
    # (transformers' split on " " finds none left after this normalizer).
    tokenizer.normalizer = normalizers.Replace(" ", _SPACE)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return tokenizer
