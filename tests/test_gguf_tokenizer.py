"""The tokenizer and chat template rebuilt from a GGUF's metadata
(`vllm_rs.gguf_tokenizer`), against transformers' own GGUF tokenizer
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`) on the packaged
SmolLM2 GGUF: the same ids for a varied set of strings (unicode, whitespace
runs, digits, code, special tokens), the same chat prompt, the same special
tokens; the cache folder is private and reused; GGUFs it cannot rebuild are
refused naming the file and what is supported.

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
from vllm_rs.gguf_tokenizer import SUPPORTED_PRE, GGUFTokenizerError, tokenizer_dir
from vllm_rs.model_files import ModelNotFoundError, packaged_model_path

try:
    GGUF = packaged_model_path()
except ModelNotFoundError as e:
    pytest.skip(f"the packaged SmolLM2 GGUF is not installed: {e}", allow_module_level=True)

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


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    from tokenizers import Tokenizer

    folder = tokenizer_dir(GGUF, cache=str(tmp_path_factory.mktemp("cache") / "gguf-tokenizers"))
    return folder, Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))


@pytest.fixture(scope="module")
def reference():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF))


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
        assert all(repr(pre) in message for pre in SUPPORTED_PRE), message
    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(GGUFTokenizerError, match="not a readable GGUF file"):
        tokenizer_dir(str(not_gguf), cache=str(tmp_path / "cache"))
