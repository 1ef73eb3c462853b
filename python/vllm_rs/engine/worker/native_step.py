"""The native step: a Llama-family model (`llama.CausalLM`: Llama, Mistral,
Qwen2, Qwen3, Granite, SmolLM3, Phi-3 and their kin) whose every linear layer the Rust kernel reads
in place runs a whole forward pass in one call of
`vllm_rs._core.DecoderStack` (rust/kernels/src/decoder.rs): the same
weights (the GGUF file's blocks, or a half-precision checkpoint's rows),
the same paged KV cache tensors, the same arithmetic as the torch path,
but no Python between its ~400 operations. The runner takes it where
`native_step_unsupported` finds nothing against it; the torch modules stay
the one description of the model (this module only reads their weights),
and serve every other case (CUDA, other dtypes, Gemma 3, dense weights,
`--enforce-eager`). docs/real-model-speed.md, "The native step", has the
measurements."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from vllm_rs import _core
from vllm_rs.engine.cpu_threads import kernel_threads
from vllm_rs.engine.layers.layernorm import RMSNorm
from vllm_rs.engine.layers.packed_weights import PackedLinear
from vllm_rs.engine.layers.rotary_embedding import rope_attention_factor
from vllm_rs.engine.models.llama import CausalLM


def native_step_unsupported(model: nn.Module, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `model` cannot run as a native step (None when it can): it must be
    a `llama.CausalLM` itself (not a subclass with its own layers), on the
    CPU in float32, every linear layer and the output head held as blocks
    the kernel reads, every norm float32."""
    if type(model) is not CausalLM:
        return f"{type(model).__name__} has layers of its own"
    if device.type != "cpu" or dtype != torch.float32:
        return f"it runs on the CPU in float32, not {device.type} in {str(dtype).removeprefix('torch.')}"
    linears = [m for m in model.modules() if isinstance(m, (nn.Linear, PackedLinear))]
    if not isinstance(getattr(model, "lm_head", None), PackedLinear) or any(
        not isinstance(m, PackedLinear) or m.blocks is None for m in linears
    ):
        return "some weights are not held as blocks the kernel reads (dense float32 weights)"
    if any(m.weight.dtype != torch.float32 for m in model.modules() if isinstance(m, RMSNorm)):
        return "its norms are not float32"
    return None


def _floats(tensor: torch.Tensor | None) -> np.ndarray | None:
    return None if tensor is None else tensor.detach().contiguous().numpy()


def _linear(layer: PackedLinear) -> tuple[int, np.ndarray, int, int, np.ndarray | None]:
    blocks = layer.blocks
    return (blocks.type, blocks.rows, layer.out_features, layer.in_features, _floats(layer.bias))


class NativeStep:
    """A `llama.CausalLM`'s decoder layers, final norm and output head bound
    to the layers' KV caches (bound already, `bind_kv_cache`), run one step
    at a time by `forward`, its products at `precision` ("exact" or
    "int8", `--kernel-precision`). Build only where `native_step_unsupported`
    is None."""

    def __init__(self, model: CausalLM, precision: str = "exact"):
        c = model.config
        layers = []
        scale = None
        for layer in model.model.layers:
            attn = layer.self_attn
            scale = attn.attn.scale
            norms = (attn.q_norm.weight, attn.k_norm.weight) if attn.qk_norm else (None, None)
            linears = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]
            linears += [layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj]
            layers.append((
                _floats(layer.input_layernorm.weight), _floats(layer.post_attention_layernorm.weight),
                _floats(norms[0]), _floats(norms[1]), [_linear(m) for m in linears], attn.attn.sliding_window,
                attn.rope,
            ))  # fmt: skip
        caches = [layer.self_attn.attn.cache_arrays() for layer in model.model.layers]
        shape = (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.vocab_size,
                 c.rms_norm_eps, scale, c.residual_multiplier, c.rotary_dim or c.head_dim,
                 rope_attention_factor(c))  # fmt: skip
        self.embedding_multiplier, self.logits_scaling = c.embedding_multiplier, c.logits_scaling
        self.vocab = c.vocab_size
        self._embed = model.model.embed_tokens
        cache_dtype = str(model.model.layers[0].self_attn.attn.kv_cache.dtype).removeprefix("torch.")
        self._stack = _core.DecoderStack(
            shape, _floats(model.inv_freq), layers, _floats(model.model.norm.weight), _linear(model.lm_head), caches,
            cache_dtype, precision,
        )  # fmt: skip

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: np.ndarray,
        slot_mapping: np.ndarray,
        key_starts: np.ndarray,
        key_slots: np.ndarray,
        logits_rows: np.ndarray,
    ) -> torch.Tensor:
        """The logits (float32 `[len(logits_rows), vocab]`) of the step whose
        tokens are `input_ids` at `positions`, writing their keys and values
        to `slot_mapping`; token t's key at position p is in slot
        `key_slots[key_starts[t] + p]` (every array int64)."""
        x = self._embed(input_ids).numpy()
        if not x.flags.writeable or not x.flags.c_contiguous:
            x = np.array(x, dtype=np.float32, order="C")
        if self.embedding_multiplier != 1.0:
            x *= np.float32(self.embedding_multiplier)
        logits = np.empty((len(logits_rows), self.vocab), np.float32)
        self._stack.forward(x, positions, slot_mapping, key_starts, key_slots, logits_rows, logits, kernel_threads())
        if self.logits_scaling != 1.0:
            logits /= np.float32(self.logits_scaling)
        return torch.from_numpy(logits)
