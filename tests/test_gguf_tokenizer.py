"""The tokenizer and chat template rebuilt from a GGUF's metadata
(`vllm_rs.tokenizer.gguf`), against transformers' own GGUF tokenizer
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`) on the packaged
SmolLM2 GGUF (byte-level BPE) and the packaged Gemma 3 270M GGUF
(SentencePiece): the same ids and decoded text for a varied set of strings
(unicode, whitespace runs, digits, code, emoji, special tokens), the same
chat prompt, the same special tokens; the cache folder is private and
reused; GGUFs it cannot rebuild are refused naming the file and what is
supported. Each model's tests skip, saying why, where its package is missing.

One known difference: transformers' GGUF converter gives every `gpt2`-model
GGUF GPT-2's plain byte-level pre-tokenizer, ignoring `tokenizer.ggml.pre`;
SmolLM2's own tokenizer (and llama.cpp's `smollm` pre-tokenizer) first
isolates every digit, which changes the ids where whitespace precedes a
digit ("\r\n0"). Random text is therefore compared with transformers'
tokenizer given SmolLM2's pre-tokenizer (its vocabulary, merges and added
tokens still transformers' own), and the difference itself is checked."""

from __future__ import annotations

import json
import os
import random
import stat
import struct

import pytest
from vllm_rs.model_files import ModelNotFoundError, packaged_model_path
from vllm_rs.tokenizer.gguf import SUPPORTED_PRE, GGUFTokenizerError, tokenizer_dir
from vllm_rs.tokenizer.gguf_sentencepiece import GEMMA_ARCHITECTURES

from tests.support.gemma3_270m import GEMMA_TURNS_TEMPLATE, gemma3_270m_path

try:
    GGUF = packaged_model_path()
    NO_SMOLLM2 = ""
except ModelNotFoundError as e:
    GGUF, NO_SMOLLM2 = "", f"the packaged SmolLM2 GGUF is not installed: {e}"
smollm2 = pytest.mark.skipif(not GGUF, reason=NO_SMOLLM2)

TEXTS = [
    "Hello world",
    "What is the capital of France?",
    "  leading and   multiple    spaces\t\ttabs\n\nnewlines\r\n",
    "12345 67.89 3,141,592 2026-12-01 0x1F 1e-9",
    "def f(x):\n    return x**2  # square\n\tif x != 0: print(f'{x!r}')\n",
    "naïve café 日本語 😀 Ελληνικά русский عربى",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "don't I'll we've THEY'RE",
    "a<|endoftext|>b<|im_end|>c",
    "émoji🤖🤖 mixed123abc",
    "   ",
    "",
    "\u00a0nbsp\u2003em\u200bzero-width",
    '{"key": [1, 2, {"nested": null}], "s": "\\u00e9"}',
    "<html><body class='x'>&amp;</body></html>",
    "Ünïcödé NFC e\u0301 vs \u00e9",
]


def random_texts(n: int, seed: int = 0) -> list[str]:
    """Random strings over ASCII, whitespace, digits, accents, CJK and emoji."""
    rng = random.Random(seed)
    pieces = list("abcxyzABC 019.,;:!?'\"-_()[]{}\n\t") + ["  ", "\r\n", "é", "ß", "中", "文", "😀", "🤖", "ü", "ñ"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 60))) for _ in range(n)]


def _rebuilt(gguf: str, cache) -> tuple[str, object]:
    """The folder rebuilt for `gguf` under `cache`, and its `tokenizer.json` loaded."""
    from tokenizers import Tokenizer

    folder = tokenizer_dir(gguf, cache=str(cache / "gguf-tokenizers"))
    return folder, Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))


def _transformers_tokenizer(gguf: str):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    if not GGUF:
        pytest.skip(NO_SMOLLM2)
    return _rebuilt(GGUF, tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def reference():
    if not GGUF:
        pytest.skip(NO_SMOLLM2)
    return _transformers_tokenizer(GGUF)


def test_ids_equal_transformers_gguf_tokenizer(ours, reference):
    _, tokenizer = ours
    for text in TEXTS:
        expected = reference.encode(text, add_special_tokens=False)
        assert tokenizer.encode(text, add_special_tokens=False).ids == expected, repr(text)
        assert tokenizer.decode(expected, skip_special_tokens=False) == reference.decode(expected), repr(text)


def test_random_text_equals_transformers_with_smollm2_pre_tokenizer(ours, reference):
    from tokenizers import Tokenizer, pre_tokenizers

    _, tokenizer = ours
    smollm2 = Tokenizer.from_str(reference.backend_tokenizer.to_str())
    smollm2.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    differs = 0
    for text in random_texts(300):
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert ids == smollm2.encode(text, add_special_tokens=False).ids, repr(text)
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
        differs += ids != reference.encode(text, add_special_tokens=False)
    # Whitespace before a digit: the digit is its own piece first, so "\r\n" stays one token.
    assert tokenizer.encode("a\r\n0").ids == [tokenizer.token_to_id(t) for t in ("a", "čĊ", "0")]
    assert reference.encode("a\r\n0") == [tokenizer.token_to_id(t) for t in ("a", "č", "Ċ", "0")]
    assert differs, "random text this varied meets whitespace before a digit"


def test_special_tokens_template_and_eos_equal_transformers(ours, reference):
    folder, tokenizer = ours
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(os.path.join(folder, "generation_config.json"), encoding="utf-8") as f:
        generation = json.load(f)
    assert (config["bos_token"], config["eos_token"]) == (reference.bos_token, reference.eos_token)
    assert generation["eos_token_id"] == [reference.eos_token_id]
    # SmolLM2 adds no BOS to a raw prompt (tokenizer.ggml.add_bos_token is false).
    assert config["add_bos_token"] is False
    assert tokenizer.encode("Hi there", add_special_tokens=True).ids == reference.encode("Hi there")
    assert reference.bos_token_id not in reference.encode("Hi there")
    assert {t.content for t in tokenizer.get_added_tokens_decoder().values()} >= {"<|im_start|>", "<|im_end|>"}
    import jinja2

    template = jinja2.Environment().from_string(config["chat_template"])
    for messages in (
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "and 3+3 ü?"},
        ],
    ):
        for add_generation_prompt in (True, False):
            expected = reference.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            assert template.render(messages=messages, add_generation_prompt=add_generation_prompt) == expected


@smollm2
def test_the_folder_is_private_reused_and_rebuilt_for_another_file(tmp_path):
    cache = tmp_path / "cache" / "gguf-tokenizers"
    first = tokenizer_dir(GGUF, cache=str(cache))
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(first).st_mode) == 0o700
    assert sorted(os.listdir(first)) == ["generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    built = os.stat(os.path.join(first, "tokenizer.json")).st_mtime_ns
    assert tokenizer_dir(GGUF, cache=str(cache)) == first
    assert os.stat(os.path.join(first, "tokenizer.json")).st_mtime_ns == built, "a cached folder is not rewritten"
    os.chmod(cache, 0o755)
    assert tokenizer_dir(GGUF, cache=str(cache)) == first
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700, "a loosened cache folder is made private again"
    assert not [n for n in os.listdir(cache) if n.startswith(".tmp-")], "no staging folder is left behind"


# ---- Gemma 3 (SentencePiece) ----

GEMMA_TEXTS = [
    *TEXTS,
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<bos>in the middle<eos> and <pad>",
    " leading space,  two  spaces,   three,\n\n\nthree newlines\t\ttabs",
    "1234567890 3.14159 -42 1,000,000",
    "<table><tr><td>cell</td></tr></table> <code>x</code>",
    "rare: \U0001d518\U0001d52b\U0001d526 \U0001f9ec \ua66e \x7f \u2581 \u2581\u2581",
    "emoji 👩‍👩‍👧 🇫🇷 ❤️ 🤖🤖🤖",
    "for (int i = 0; i < n; ++i) {\n    sum += a[i];\n}\n",
]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """The packaged Gemma 3 GGUF: (our folder, our tokenizer, transformers' tokenizer)."""
    gguf = gemma3_270m_path()
    return *_rebuilt(gguf, tmp_path_factory.mktemp("gemma-cache")), _transformers_tokenizer(gguf)


def test_gemma_ids_and_text_equal_transformers(gemma):
    _, tokenizer, reference = gemma
    for text in GEMMA_TEXTS + random_texts(300, seed=1):
        expected = reference.encode(text, add_special_tokens=False)
        assert tokenizer.encode(text, add_special_tokens=False).ids == expected, repr(text)
        assert tokenizer.decode(expected, skip_special_tokens=False) == reference.decode(expected), repr(text)
        assert tokenizer.decode(expected, skip_special_tokens=True) == reference.decode(
            expected, skip_special_tokens=True
        ), repr(text)
        # BOS first, once (tokenizer.ggml.add_bos_token is true).
        assert tokenizer.encode(text).ids == reference.encode(text) == [reference.bos_token_id, *expected], repr(text)
    # Byte fallback: a character outside the vocabulary is its UTF-8 bytes.
    rare = tokenizer.encode("\U0001d518", add_special_tokens=False).tokens
    assert rare == ["<0xF0>", "<0x9D>", "<0x94>", "<0x98>"], rare


def test_gemma_special_tokens_eos_and_chat_prompt_equal_transformers(gemma):
    folder, tokenizer, reference = gemma
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(os.path.join(folder, "generation_config.json"), encoding="utf-8") as f:
        generation = json.load(f)
    assert (config["bos_token"], config["eos_token"], config["add_bos_token"]) == (
        reference.bos_token, reference.eos_token, True
    )  # fmt: skip
    # The GGUF names only <eos>; a turn ends with <end_of_turn>, which stops generation too.
    end_of_turn = reference.convert_tokens_to_ids("<end_of_turn>")
    assert generation["eos_token_id"] == [reference.eos_token_id, end_of_turn]
    assert generation["bos_token_id"] == reference.bos_token_id
    # This GGUF (a base model) has no chat template, in transformers' reading too.
    assert "chat_template" not in config and reference.chat_template is None
    # A template that writes <bos> itself: the prompt is encoded without
    # special tokens (as vLLM encodes a chat prompt), so <bos> comes once.
    import jinja2

    template = jinja2.Environment().from_string(GEMMA_TURNS_TEMPLATE)
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy? ü 😀"},
    ]
    rendered = template.render(messages=messages, add_generation_prompt=True, bos_token=config["bos_token"])
    expected = reference.apply_chat_template(
        messages, chat_template=GEMMA_TURNS_TEMPLATE, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert tokenizer.encode(rendered, add_special_tokens=False).ids == list(expected)
    assert list(expected).count(reference.bos_token_id) == 1 and expected[0] == reference.bos_token_id


def _gguf(path, metadata: dict) -> str:
    """A minimal GGUF (version 3, no tensors) holding `metadata` (str, int,
    bool, or lists of str/int)."""

    def string(s: str) -> bytes:
        raw = s.encode()
        return struct.pack("<Q", len(raw)) + raw

    def value(v) -> bytes:
        if isinstance(v, bool):
            return struct.pack("<I?", 7, v)
        if isinstance(v, int):
            return struct.pack("<Ii", 5, v)
        if isinstance(v, str):
            return struct.pack("<I", 8) + string(v)
        kind = 8 if isinstance(v[0], str) else 5
        items = b"".join(string(x) if kind == 8 else struct.pack("<i", x) for x in v)
        return struct.pack("<IIQ", 9, kind, len(v)) + items

    body = b"".join(string(k) + value(v) for k, v in metadata.items())
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata)) + body)
    return str(path)


@pytest.mark.parametrize(
    ("metadata", "needle"),
    [
        ({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<s>", "a"]}, "tokenizer.ggml.model='llama'"),
        (
            {"general.architecture": "llama", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<s>", "a"]},
            "general.architecture='llama'",
        ),
        (
            {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "deepseek-llm", "tokenizer.ggml.tokens": ["a"]},
            "tokenizer.ggml.pre='deepseek-llm'",
        ),
        ({"general.architecture": "llama"}, "no tokenizer"),
    ],
)
def test_unsupported_gguf_tokenizers_are_refused_naming_the_file(tmp_path, metadata, needle):
    path = _gguf(tmp_path / "odd.gguf", metadata)
    with pytest.raises(GGUFTokenizerError) as refused:
        tokenizer_dir(path, cache=str(tmp_path / "cache"))
    message = str(refused.value)
    assert path in message and needle in message, message
    if "no tokenizer" not in needle:
        assert all(repr(name) in message for name in (*SUPPORTED_PRE, *GEMMA_ARCHITECTURES)), message
    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(GGUFTokenizerError, match="not a readable GGUF file"):
        tokenizer_dir(str(not_gguf), cache=str(tmp_path / "cache"))
