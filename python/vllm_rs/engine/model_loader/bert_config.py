"""A BERT encoder's hyperparameters from its `config.json`, read without
torch (`serve` resolves the model before anything starts)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_rs.engine.model_loader.checkpoint import CheckpointError
from vllm_rs.engine.model_loader.pooler_config import ENCODER_ARCHITECTURES

#: transformers' activation names -> what `models/bert.py` computes.
BERT_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


@dataclass(frozen=True)
class BertConfig:
    """The hyperparameters of a BERT encoder (`BertModel`, or
    `BertForSequenceClassification` with `num_labels` outputs)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str
    num_labels: int
    checkpoint_dtype: str | None = None
    #: Output sizes a Matryoshka model may be cut to (`matryoshka_dimensions`);
    #: empty with `is_matryoshka` alone: any size.
    matryoshka_dimensions: tuple[int, ...] = ()
    is_matryoshka: bool = False

    @property
    def model_type(self) -> str:
        """The Hugging Face `model_type`."""
        return "bert"

    def num_parameters(self) -> int:
        """Parameters of the encoder (for the memory check)."""
        h, i = self.hidden_size, self.intermediate_size
        layer = 4 * h * h + 2 * h * i + 9 * h + i
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size + 2) * h
        return self.num_layers * layer + embeddings + h * h + h + (h + 1) * self.num_labels


def bert_config_from_hf(config: dict[str, Any], where: str) -> BertConfig | None:
    """The BertConfig of a parsed `config.json`, None when it names no
    encoder architecture; raises CheckpointError naming `where` for a
    setting the engine does not run."""
    architecture = next((a for a in config.get("architectures") or [] if a in ENCODER_ARCHITECTURES), None)
    if architecture is None:
        return None
    try:
        act = config.get("hidden_act", "gelu")
        if act not in BERT_ACTIVATIONS:
            raise CheckpointError(f"{where}: BERT with hidden_act {act!r} is not supported")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise CheckpointError(f"{where}: only absolute position embeddings are supported")
        labels = len(config["id2label"]) if config.get("id2label") else int(config.get("num_labels", 2))
        dims = config.get("matryoshka_dimensions") or ()
        return BertConfig(
            architecture=architecture,
            vocab_size=int(config["vocab_size"]),
            hidden_size=int(config["hidden_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=int(config["num_attention_heads"]),
            intermediate_size=int(config["intermediate_size"]),
            max_position_embeddings=int(config.get("max_position_embeddings", 512)),
            type_vocab_size=int(config.get("type_vocab_size", 2)),
            layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
            hidden_act=act,
            num_labels=labels if architecture == "BertForSequenceClassification" else 0,
            checkpoint_dtype=config.get("torch_dtype") or config.get("dtype"),
            matryoshka_dimensions=tuple(int(d) for d in dims),
            is_matryoshka=bool(config.get("is_matryoshka") or dims),
        )
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{where}: missing or invalid setting {e}") from None
