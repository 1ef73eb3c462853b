"""Small Hugging Face tokenizers made offline with the `tokenizers` package,
written as model directories (`tokenizer.json` + `tokenizer_config.json`):
a SentencePiece-style one (Metaspace `▁`, byte fallback, Llama's decoder) and
a GPT-2-style byte-level BPE. No tests live here."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers.processors import TemplateProcessing

#: Special tokens of both tokenizers, ids 0.. in this order.
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
BOS, EOS = "<s>", "</s>"

#: Whole pieces of the SentencePiece-style vocabulary (after the 256 bytes).
METASPACE_PIECES = [
    "▁The", "▁capital", "▁is", "▁Paris", "▁", "▁hello", "▁world", "!", ".",
    "▁ST", "OP", "▁France", "▁of", "▁你好", "世界",
]  # fmt: skip

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Text the byte-level BPE is trained on (its merges come from here).
BYTE_LEVEL_CORPUS = [
    "The capital of France is Paris.",
    "hello world! hello there, the world is wide.",
    "STOP here or go on: STOP.",
] * 20


def metaspace_tokenizer() -> Tokenizer:
    """Llama-style: Unigram pieces with `▁` for spaces (prepended to the first
    word), bytes `<0xNN>` for anything else, and Llama's decoder (`▁` to
    space, bytes fused, the leading space stripped)."""
    vocab = [(t, 0.0) for t in SPECIAL_TOKENS]
    vocab += [(f"<0x{b:02X}>", -10.0) for b in range(256)]
    vocab += [(piece, -1.0) for piece in METASPACE_PIECES]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    _add_bos(tokenizer)
    return tokenizer


def byte_level_tokenizer() -> Tokenizer:
    """GPT-2-style: byte-level BPE (all 256 bytes plus merges trained on a
    tiny corpus), no BOS added."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(BYTE_LEVEL_CORPUS, trainer)
    return tokenizer


def bytes_only_tokenizer() -> Tokenizer:
    """Every byte its own token, id = the byte (the echo model's built-in
    vocabulary), EOS `</s>` 256, no merges: a Hugging Face tokenizer any
    frontend can load in front of the echo engine."""
    vocab = {char: byte for byte, char in _byte_level_chars().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(EOS, special=True)])
    assert tokenizer.token_to_id(EOS) == 256
    return tokenizer


def _add_bos(tokenizer: Tokenizer) -> None:
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)]
    )


def write_model_dir(tokenizer: Tokenizer, directory: Path) -> Path:
    """Writes `tokenizer` as a model directory with EOS, BOS and a chat template."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"bos_token": BOS, "eos_token": EOS, "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def piece_ids(tokenizer: Tokenizer, *pieces: str) -> list[int]:
    """The ids of vocabulary pieces (raising on a piece not in it)."""
    ids = [tokenizer.token_to_id(p) for p in pieces]
    assert None not in ids, (pieces, ids)
    return ids


def byte_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """One token per UTF-8 byte of `text`: `<0xNN>` pieces (SentencePiece
    style) or the byte-level alphabet's characters (GPT-2 style)."""
    mapping = _byte_level_chars()
    out = []
    for b in text.encode():
        token_id = tokenizer.token_to_id(f"<0x{b:02X}>")
        if token_id is None:
            token_id = tokenizer.token_to_id(mapping[b])
        assert token_id is not None, b
        out.append(token_id)
    return out


def _byte_level_chars() -> dict[int, str]:
    """GPT-2's byte-to-character table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars
