"""vLLM 0.33's `PoolingParams` as the engine reads them off the wire (an
array-like struct, trailing defaults left out) and checks them against the
model, with vLLM's defaults and refusals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from vllm_rs.engine.logprobs import RAW_VIEW_EXT
from vllm_rs.engine.pooler_config import PoolerConfig
from vllm_rs.engine.request import InvalidRequestError

#: The slots of vLLM's PoolingParams, in order (the rest are internal).
_SLOTS = (
    "truncate_prompt_tokens", "dimensions", "normalize", "softmax", "activation", "use_activation",
    "step_tag_id", "returned_token_ids", "task", "requires_token_ids", "skip_reading_prefix_cache", "extra_kwargs",
)  # fmt: skip
#: Parameters each task takes (vLLM's `valid_parameters`).
_VALID = {
    "embed": ("dimensions", "normalize"),
    "token_embed": ("dimensions", "normalize"),
    "classify": ("use_activation",),
    "score": ("use_activation",),
}
#: The key of `extra_kwargs` that says where a cross-encoder pair's second
#: text starts (token type 1 from there on), as vLLM compresses `token_type_ids`.
TOKEN_TYPE_KEY = "compressed_token_type_ids"


@dataclass
class PoolingParams:
    """A pooling request's parameters, resolved against the model's pooler."""

    task: str
    dimensions: int | None = None
    normalize: bool | None = None
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
            raise InvalidRequestError(f"Unknown pooling task: {task}")
        # `softmax` and `activation` are vLLM's deprecated names of use_activation.
        activation = next(
            (values.get(k) for k in ("use_activation", "softmax", "activation") if values.get(k) is not None), None
        )
        extra = values.get("extra_kwargs") or {}
        start = extra.get(TOKEN_TYPE_KEY) if isinstance(extra, dict) else None
        params = cls(task, values.get("dimensions"), values.get("normalize"), activation, start)
        for key in ("dimensions", "token_type_start"):
            value = getattr(params, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidRequestError(f"{key} must be an integer")
        return params

    def verify(
        self, model_task: str, pooler: PoolerConfig, model_name: str, matryoshka: tuple[bool, tuple[int, ...]]
    ) -> None:
        """Fills the pooler's and vLLM's defaults; raises InvalidRequestError
        (vLLM's words) for a task the model does not run or a parameter the
        task or model refuses. `matryoshka`: whether the model may be cut
        short, and to which sizes (empty: any)."""
        family = "embed" if self.task in ("embed", "token_embed") else "classify"
        if family != model_task:
            raise InvalidRequestError(f"The model does not support the {self.task} task (it serves {model_task})")
        invalid = [k for k in ("dimensions", "normalize", "use_activation")
                   if k not in _VALID[self.task] and getattr(self, k) is not None]  # fmt: skip
        if invalid:
            raise InvalidRequestError(
                f"Task {self.task} only supports {list(_VALID[self.task])} parameters, "
                f"does not support {invalid} parameters"
            )
        for key in _VALID[self.task]:
            if getattr(self, key) is None:
                setattr(self, key, getattr(pooler, key))
        if family == "embed":
            if self.normalize is None:
                self.normalize = True
            if self.dimensions is not None:
                allowed, sizes = matryoshka
                if not allowed:
                    raise InvalidRequestError(
                        f'Model "{model_name}" does not support matryoshka representation, '
                        "changing output dimensions will lead to poor results."
                    )
                if sizes and self.dimensions not in sizes:
                    raise InvalidRequestError(
                        f'Model "{model_name}" only supports {list(sizes)} matryoshka dimensions, '
                        "use other output dimensions will lead to poor results."
                    )
                if self.dimensions < 1:
                    raise InvalidRequestError("Dimensions must be greater than 0")
        elif self.use_activation is None:
            self.use_activation = True


def tensor_wire(vector: Any) -> list[Any]:
    """A float32 CPU tensor as vLLM's encoder writes a torch tensor:
    `[dtype, shape, raw bytes]`, the bytes inline."""
    array = vector.float().contiguous().numpy()
    return ["float32", list(array.shape), msgpack.ExtType(RAW_VIEW_EXT, array.tobytes())]
