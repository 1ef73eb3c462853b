"""vLLM 0.33's `PoolingParams` as the engine reads them off the wire (an
array-like struct, trailing defaults left out) and checks them against the
model, with vLLM's defaults and refusals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from vllm_rs.engine.model_loader.pooler_config import PoolerConfig
from vllm_rs.engine.sample.logprobs import RAW_VIEW_EXT
from vllm_rs.engine.sched.request import InvalidRequestError

#: The slots of vLLM 0.33's PoolingParams, in order, through the ones the
#: engine reads (the rest are internal).
_SLOTS = (
    "use_activation", "dimensions", "step_tag_id", "returned_token_ids", "task", "requires_token_ids",
    "skip_reading_prefix_cache", "late_interaction_params", "extra_kwargs",
)  # fmt: skip
#: The tasks the engine runs and the parameters each takes (vLLM's
#: `valid_parameters`, less late chunking).
_VALID = {
    "embed": ("dimensions", "use_activation"),
    "token_embed": ("dimensions", "use_activation"),
    "classify": ("use_activation",),
}
#: The key of `extra_kwargs` that says where a cross-encoder pair's second
#: text starts (token type 1 from there on), as vLLM compresses `token_type_ids`.
TOKEN_TYPE_KEY = "compressed_token_type_ids"


@dataclass
class PoolingParams:
    """A pooling request's parameters, resolved against the model's pooler."""

    task: str
    dimensions: int | None = None
    #: An embedding's L2 normalization, a classifier's sigmoid or softmax.
    use_activation: bool | None = None
    #: Where token type 1 starts (a cross-encoder pair), when given.
    token_type_start: int | None = None

    @classmethod
    def from_wire(cls, items: Any) -> PoolingParams:
        """Reads the array; raises InvalidRequestError for a bad shape or task."""
        if isinstance(items, dict):
            values = items
        elif isinstance(items, (list, tuple)):
            values = dict(zip(_SLOTS, items, strict=False))
        else:
            raise InvalidRequestError("pooling_params must be an array")
        task = values.get("task")
        if task not in _VALID:
            raise InvalidRequestError(f"Unknown pooling task: {task!r}")
        activation = values.get("use_activation")
        if activation is not None and not isinstance(activation, bool):
            raise InvalidRequestError("use_activation must be a boolean")
        extra = values.get("extra_kwargs") or {}
        start = extra.get(TOKEN_TYPE_KEY) if isinstance(extra, dict) else None
        params = cls(task, values.get("dimensions"), activation, start)
        for key in ("dimensions", "token_type_start"):
            value = getattr(params, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidRequestError(f"{key} must be an integer")
        return params

    def verify(self, model_task: str, pooler: PoolerConfig, model_name: str, matryoshka: Matryoshka) -> None:
        """Fills the pooler's and vLLM's defaults; raises InvalidRequestError
        (vLLM 0.33's words) for a task the model does not run or a parameter
        the task or model refuses."""
        family = "embed" if self.task in ("embed", "token_embed") else "classify"
        if family != model_task:
            raise InvalidRequestError(f"The model does not support the {self.task} task (it serves {model_task})")
        invalid = [k for k in ("dimensions", "use_activation")
                   if k not in _VALID[self.task] and getattr(self, k) is not None]  # fmt: skip
        if invalid:
            raise InvalidRequestError(
                f"Task {self.task} only supports {list(_VALID[self.task])} parameters, "
                f"does not support {invalid} parameters"
            )
        for key in _VALID[self.task]:
            if getattr(self, key) is None:
                setattr(self, key, getattr(pooler, key))
        if self.use_activation is None:
            self.use_activation = True
        if family == "embed" and self.dimensions is not None:
            matryoshka.check(model_name, self.dimensions)


@dataclass(frozen=True)
class Matryoshka:
    """Which output sizes an embedding model may be cut to."""

    #: Whether it may be cut at all (`is_matryoshka` or `matryoshka_dimensions`).
    allowed: bool
    #: The sizes it may be cut to; empty: any in [1, embedding_size].
    sizes: tuple[int, ...]
    #: The full embedding's size.
    embedding_size: int

    def check(self, model_name: str, dimensions: int) -> None:
        """Raises InvalidRequestError, with vLLM 0.33's message, unless the
        model may be cut to `dimensions`."""
        if not self.allowed:
            raise InvalidRequestError(
                f"Model {model_name!r} does not support Matryoshka embeddings; "
                f"dimensions must be unset (received dimensions={dimensions})."
            )
        if not 1 <= dimensions <= self.embedding_size:
            raise InvalidRequestError(
                f"Model {model_name!r} only supports dimensions in range [1, {self.embedding_size}], got {dimensions}."
            )
        if self.sizes and dimensions not in self.sizes:
            raise InvalidRequestError(
                f"Model {model_name!r} only supports Matryoshka dimensions {list(self.sizes)}, got {dimensions}."
            )


def tensor_wire(vector: Any) -> list[Any]:
    """A float32 CPU tensor as vLLM's encoder writes a torch tensor:
    `[dtype, shape, raw bytes]`, the bytes inline."""
    array = vector.float().contiguous().numpy()
    return ["float32", list(array.shape), msgpack.ExtType(RAW_VIEW_EXT, array.tobytes())]
