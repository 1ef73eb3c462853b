"""Tiny random-init checkpoints written with transformers for the pooling
tests: a BERT embedding model (optionally as a sentence-transformers
folder), a BERT cross-encoder and a Qwen3 decoder, each with a small
WordPiece tokenizer of its own."""

from __future__ import annotations

import json
import os

#: Words of the tiny tokenizer's vocabulary (besides the special tokens).
WORDS = (
    "the a cat dog sat on mat ran fast slow red blue green house tree car road sky sun moon star "
    "is was and or but not big small old new hot cold up down in out we you they it this that"
).split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_tokenizer(path: str) -> None:
    """A BERT WordPiece tokenizer over `WORDS` (lowercasing, [CLS] text
    [SEP], pairs with token type 1), saved with its tokenizer.json."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
        mask_token="[MASK]", model_max_length=64, model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )  # fmt: skip
    os.makedirs(path, exist_ok=True)
    wrapped.save_pretrained(path)


def bert_config(**extra):
    """A tiny BertConfig: 2 layers, hidden 32."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=len(SPECIAL) + len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, **extra,
    )  # fmt: skip


def write_bert(path: str, seed: int = 0, st_pooling: str | None = None, normalize: bool = False) -> str:
    """A BertModel folder; with `st_pooling` (`cls_token`, `mean_tokens`,
    `lasttoken`) a sentence-transformers one (modules.json, 1_Pooling,
    a Normalize module when `normalize`)."""
    import torch
    from transformers import BertModel

    torch.manual_seed(seed)
    BertModel(bert_config()).eval().save_pretrained(path)
    write_tokenizer(path)
    if st_pooling is not None:
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]
        if normalize:
            modules.append(
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
            )
            os.makedirs(os.path.join(path, "2_Normalize"), exist_ok=True)
        _write_json(os.path.join(path, "modules.json"), modules)
        modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "lasttoken")
        pooling = {"word_embedding_dimension": 32, **{f"pooling_mode_{m}": m == st_pooling for m in modes}}
        _write_json(os.path.join(path, "1_Pooling", "config.json"), pooling)
        _write_json(os.path.join(path, "sentence_bert_config.json"), {"max_seq_length": 64, "do_lower_case": False})
        _write_json(os.path.join(path, "config_sentence_transformers.json"), {"similarity_fn_name": "cosine"})
    return path


def write_cross_encoder(path: str, num_labels: int = 1, seed: int = 0, id2label: dict[int, str] | None = None) -> str:
    """A BertForSequenceClassification folder with `num_labels` outputs, or
    one per class of `id2label` (the class names its config.json carries)."""
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    labels = {"num_labels": num_labels} if id2label is None else {"id2label": id2label}
    BertForSequenceClassification(bert_config(**labels)).eval().save_pretrained(path)
    write_tokenizer(path)
    return path


def write_qwen3(path: str, seed: int = 0) -> str:
    """A tiny Qwen3ForCausalLM folder (float32), with the BERT tokenizer's vocabulary size."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(SPECIAL) + len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        tie_word_embeddings=True, torch_dtype="float32",
    )  # fmt: skip
    Qwen3ForCausalLM(config).eval().save_pretrained(path)
    write_tokenizer(path)
    return path


def _write_json(path: str, value) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f)
