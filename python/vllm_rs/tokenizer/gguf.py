"""A GGUF model's tokenizer and chat template as Hugging Face files, built from
the GGUF's metadata alone (read with `struct`: `engine.gguf_file`; written
with the `tokenizers` library; no `transformers`): `tokenizer.json`, `tokenizer_config.json` and
`generation_config.json` in a private cache folder (mode 0700) keyed by the
GGUF file, which the Rust frontend and the engine then read as they read any
model's tokenizer folder.

Supported: byte-level BPE vocabularies (`tokenizer.ggml.model` = `gpt2`)
whose pre-tokenizer (`tokenizer.ggml.pre`) is one of `SUPPORTED_PRE`:
SmolLM/SmolLM2 (`smollm`), Llama 3.x (`llama-bpe`, `llama3`, `llama-v3`) and
Qwen2/Qwen2.5/Qwen3 (`qwen2`), each rebuilt as the model's own
`tokenizer.json` writes it (llama.cpp's split regex for that name); and
Gemma's SentencePiece vocabulary (`llama` model, `general.architecture` one
of `GEMMA_ARCHITECTURES`: `gguf_sentencepiece`). Anything else raises
GGUFTokenizerError naming the file and what it has.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from typing import Any

from vllm_rs.logger import init_logger
from vllm_rs.tokenizer.gguf_sentencepiece import GEMMA_ARCHITECTURES, build_gemma_tokenizer, gemma_tokens

logger = init_logger(__name__)

#: Bumped whenever what is written changes, so stale cache folders are not reused.
FORMAT_VERSION = 2
#: The folder (under the vllm-rs cache) that holds one folder per GGUF file.
CACHE_SUBDIR = "gguf-tokenizers"

# The split regexes of the Hugging Face tokenizers these GGUFs were converted
# from (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_LLAMA3` and `_QWEN2`).
_LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: `tokenizer.ggml.pre` values this module rebuilds, and the family each names.
SUPPORTED_PRE = {
    "smollm": "smollm",
    "llama-bpe": "llama3",
    "llama3": "llama3",
    "llama-v3": "llama3",
    "qwen2": "qwen2",
}

#: The family of a supported SentencePiece (`llama` model) vocabulary.
GEMMA = "gemma"

# llama.cpp's token types (`tokenizer.ggml.token_type`).
_CONTROL = 3
_USER_DEFINED = 4


class GGUFTokenizerError(ValueError):
    """A GGUF whose tokenizer cannot be rebuilt (unreadable, or a vocabulary
    or pre-tokenizer this module does not support)."""


@dataclass
class GGUFVocab:
    """The tokenizer metadata of a GGUF file."""

    model: str
    pre: str
    #: `general.architecture`: which SentencePiece tokenizer a `llama` vocabulary is.
    architecture: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_token_id: int | None
    eos_token_id: int | None
    eot_token_id: int | None
    unk_token_id: int | None
    add_bos_token: bool
    chat_template: str | None


def read_vocab(path: str) -> GGUFVocab:
    """The tokenizer metadata of the GGUF file at `path`; GGUFTokenizerError
    when it cannot be read or has no vocabulary."""
    from vllm_rs.engine.model_loader.gguf_file import GgufFormatError, read_header

    try:
        meta = read_header(path, read_arrays=True).metadata
    except GgufFormatError as e:
        raise GGUFTokenizerError(f"{path}: not a readable GGUF file: {e}") from None
    except OSError as e:
        raise GGUFTokenizerError(f"{path}: cannot read: {e.strerror or e}") from None
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFTokenizerError(f"{path}: the GGUF has no tokenizer (no tokenizer.ggml.tokens)")
    return GGUFVocab(
        model=meta.get("tokenizer.ggml.model", ""),
        pre=meta.get("tokenizer.ggml.pre", "default"),
        architecture=meta.get("general.architecture", ""),
        tokens=tokens,
        token_types=meta.get("tokenizer.ggml.token_type") or [1] * len(tokens),
        merges=meta.get("tokenizer.ggml.merges") or [],
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        eot_token_id=meta.get("tokenizer.ggml.eot_token_id"),
        unk_token_id=meta.get("tokenizer.ggml.unknown_token_id"),
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        chat_template=meta.get("tokenizer.chat_template"),
    )


def check_supported(vocab: GGUFVocab, path: str) -> str:
    """The family of `vocab` (a `SUPPORTED_PRE` value, or `GEMMA`);
    GGUFTokenizerError naming the file, its model, pre-tokenizer and
    architecture and what is supported otherwise."""
    if vocab.model == "llama" and vocab.architecture in GEMMA_ARCHITECTURES:
        return GEMMA
    family = SUPPORTED_PRE.get(vocab.pre)
    if vocab.model != "gpt2" or family is None:
        raise GGUFTokenizerError(
            f"{path}: unsupported GGUF tokenizer (tokenizer.ggml.model={vocab.model!r}, "
            f"tokenizer.ggml.pre={vocab.pre!r}, general.architecture={vocab.architecture!r}); supported: "
            f"byte-level BPE ('gpt2') with pre-tokenizer {', '.join(repr(p) for p in SUPPORTED_PRE)}, and "
            f"SentencePiece ('llama') of architecture {', '.join(repr(a) for a in GEMMA_ARCHITECTURES)}; "
            "give the model's Hugging Face folder instead (or --tokenizer DIR)"
        )
    if not vocab.merges:
        raise GGUFTokenizerError(f"{path}: a BPE vocabulary without tokenizer.ggml.merges")
    return family


def build_tokenizer(vocab: GGUFVocab, family: str) -> Any:
    """A `tokenizers.Tokenizer` equal to the model's own `tokenizer.json`:
    the family's model, normalizer, pre-tokenizer and decoder, control and
    user-defined tokens as added tokens, and BOS prepended when the GGUF
    says to."""
    from tokenizers import AddedToken, processors

    if family == GEMMA:
        tokenizer = build_gemma_tokenizer(vocab.tokens, _token(vocab, vocab.unk_token_id))
        spelled = gemma_tokens(vocab.tokens)
    else:
        tokenizer = _byte_level_tokenizer(vocab, family)
        spelled = vocab.tokens
    # A user-defined token the tokenizer spells otherwise (Gemma's runs of
    # spaces, looked up as runs of `▁`) is left to the model, as transformers
    # does: added as written it would match text the model never sees.
    added = [
        AddedToken(token, special=t == _CONTROL, normalized=False)
        for token, t, as_spelled in zip(vocab.tokens, vocab.token_types, spelled)
        if t == _CONTROL or (t == _USER_DEFINED and token == as_spelled)
    ]
    tokenizer.add_special_tokens([t for t in added if t.special])
    tokenizer.add_tokens([t for t in added if not t.special])
    if vocab.add_bos_token and vocab.bos_token_id is not None:
        bos = vocab.tokens[vocab.bos_token_id]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, vocab.bos_token_id)]
        )
    elif family != GEMMA:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def _byte_level_tokenizer(vocab: GGUFVocab, family: str) -> Any:
    """Byte-level BPE over the GGUF's tokens and merges with the family's
    pre-tokenizer (special tokens and BOS are the caller's)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    ids = {token: i for i, token in enumerate(vocab.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in vocab.merges]
    # Llama 3's tokenizer looks a whole word up before merging (llama.cpp's `ignore_merges`).
    tokenizer = Tokenizer(models.BPE(ids, merges, ignore_merges=family == "llama3"))
    if family == "smollm":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    else:
        split = _LLAMA3_SPLIT if family == "llama3" else _QWEN2_SPLIT
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if family == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _token(vocab: GGUFVocab, token_id: int | None) -> str | None:
    if token_id is None or not 0 <= token_id < len(vocab.tokens):
        return None
    return vocab.tokens[token_id]


def tokenizer_config(vocab: GGUFVocab) -> dict[str, Any]:
    """`tokenizer_config.json`: the chat template, BOS/EOS tokens and `add_bos_token`."""
    config: dict[str, Any] = {
        "add_bos_token": vocab.add_bos_token,
        "add_eos_token": False,
        "bos_token": _token(vocab, vocab.bos_token_id),
        "eos_token": _token(vocab, vocab.eos_token_id),
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if vocab.chat_template:
        config["chat_template"] = vocab.chat_template
    return config


def end_of_turn_id(vocab: GGUFVocab) -> int | None:
    """The end-of-turn id: `tokenizer.ggml.eot_token_id`, else the control
    token `<end_of_turn>` where the vocabulary has one (Gemma's GGUFs name
    only `<eos>`, yet every chat turn ends with `<end_of_turn>`: llama.cpp
    finds it by its text, and Gemma's own generation config lists it)."""
    if _token(vocab, vocab.eot_token_id) is not None:
        return vocab.eot_token_id
    for i, (token, kind) in enumerate(zip(vocab.tokens, vocab.token_types)):
        if token == "<end_of_turn>" and kind == _CONTROL:
            return i
    return None


def generation_config(vocab: GGUFVocab) -> dict[str, Any]:
    """`generation_config.json`: the end-of-sequence ids (EOS, then end-of-turn when it differs)."""
    eos = [i for i in (vocab.eos_token_id, end_of_turn_id(vocab)) if _token(vocab, i) is not None]
    config: dict[str, Any] = {"eos_token_id": list(dict.fromkeys(eos))}
    if _token(vocab, vocab.bos_token_id) is not None:
        config["bos_token_id"] = vocab.bos_token_id
    return config


def cache_root(env: dict[str, str] | None = None) -> str:
    """Where tokenizer folders are kept: `$VLLM_RS_CACHE/gguf-tokenizers`, else
    `$XDG_CACHE_HOME/vllm-rs/...`, else `~/.cache/vllm-rs/...`."""
    env = dict(os.environ) if env is None else env
    base = env.get("VLLM_RS_CACHE") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm-rs"
    )
    return os.path.join(base, CACHE_SUBDIR)


def _key(path: str) -> str:
    # The file's identity (where it is, its size and modification time): a
    # replaced GGUF gets a new folder without hashing 100s of MB every start.
    st = os.stat(path)
    ident = f"{FORMAT_VERSION}\0{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
    name = os.path.splitext(os.path.basename(path))[0]
    return f"{name}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def _private_dir(path: str) -> None:
    """Makes `path` (and its parents) if needed; it must be this user's
    directory, and is made mode 0700 (it reveals which models run)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise GGUFTokenizerError(f"{path}: the tokenizer cache folder is not a directory of this user")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def tokenizer_dir(gguf_path: str, cache: str | None = None) -> str:
    """The folder holding `tokenizer.json`, `tokenizer_config.json` and
    `generation_config.json` for the GGUF at `gguf_path`, written on first use
    (atomically: a folder is complete or absent) under `cache` (default
    `cache_root()`), mode 0700. Raises GGUFTokenizerError for an unsupported
    or unreadable GGUF."""
    root = cache or cache_root()
    _private_dir(root)
    try:
        target = os.path.join(root, _key(gguf_path))
    except OSError as e:
        raise GGUFTokenizerError(f"{gguf_path}: {e.strerror or e}") from None
    if os.path.isfile(os.path.join(target, "tokenizer.json")):
        return target
    vocab = read_vocab(gguf_path)
    family = check_supported(vocab, gguf_path)
    tokenizer = build_tokenizer(vocab, family)
    staging = tempfile.mkdtemp(prefix=".tmp-", dir=root)  # mode 0700
    try:
        tokenizer.save(os.path.join(staging, "tokenizer.json"))
        for name, value in (
            ("tokenizer_config.json", tokenizer_config(vocab)),
            ("generation_config.json", generation_config(vocab)),
        ):
            with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
                json.dump(value, f, ensure_ascii=False, indent=1)
        try:
            os.rename(staging, target)
        except OSError:
            if not os.path.isfile(os.path.join(target, "tokenizer.json")):
                raise  # not a concurrent writer that got there first
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("tokenizer of %s (%s, %d tokens) in %s", gguf_path, family, len(vocab.tokens), target)
    return target
