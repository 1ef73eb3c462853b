"""A GGUF file's tensors by their Hugging Face names, with no torch: the
name tables of each architecture, llama.cpp's Q/K row permutation undone,
Gemma's `1 +` norms taken off, Phi-3's fused projections split, a mixture
of experts' stacked `ffn_*_exps` tensors split by expert; weights of a type
the Rust kernel reads come as `GgufBlocks` (the file's own pages), the rest
as float arrays. The torch loader (`weights.py`) and the
torch-free native step (`worker/native_executor.py`) both read a GGUF
through `gguf_tensors`."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from vllm_rs.engine.layers.gguf_blocks import GgufBlocks, kernel_reads
from vllm_rs.engine.model_loader.checkpoint import CheckpointError, TransformerConfig
from vllm_rs.engine.model_loader.gguf_file import GgufTensor, read_header
from vllm_rs.engine.model_loader.registry import ModelSpec

logger = logging.getLogger(__name__)

#: GGUF tensor names -> Hugging Face names (`{i}`: the layer).
GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
#: Where the `gemma3` architecture's names differ: its `ffn_norm` is the norm
#: before the MLP, and the attention and MLP outputs have norms of their own.
GGUF_GEMMA3_LAYER_NAMES = {
    **GGUF_LAYER_NAMES,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
#: Where the `phi3` architecture's names differ: fused Q/K/V, and its
#: `ffn_up` holds the fused gate and up projections (gate first).
GGUF_PHI3_LAYER_NAMES = {
    **GGUF_LAYER_NAMES,
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "ffn_up.weight": "mlp.gate_up_proj.weight",
}
#: A mixture of experts' (`TransformerConfig.moe`): the router, Qwen2-MoE's
#: shared expert and its gate, and each layer's experts stacked in one 3-D
#: tensor per projection (`[experts, out, in]`), which `gguf_tensors` yields
#: as each expert's own (`mlp.experts.E.gate_proj.weight`, ...).
GGUF_MOE_LAYER_NAMES = {
    **GGUF_LAYER_NAMES,
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.gate_proj.weight",
    "ffn_up_exps.weight": "mlp.experts.up_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.down_proj.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
}
#: A `phi3` GGUF's LongRoPE factors: the short ones are read with the
#: weights, the long ones into the config (`checkpoint._gguf_floats`).
GGUF_ROPE_FACTORS_SHORT = "rope_factors_short.weight"
GGUF_ROPE_FACTORS_LONG = "rope_factors_long.weight"
#: llama.cpp's per-layer RoPE frequency factors (Llama 3.1's scaling).
GGUF_ROPE_FREQS = "rope_freqs.weight"
#: The RoPE factor tensors the engine runs (at most one per file).
GGUF_ROPE_FACTORS_RUN = (GGUF_ROPE_FREQS, GGUF_ROPE_FACTORS_SHORT)
#: Every RoPE factor tensor a GGUF may hold beside its weights.
GGUF_ROPE_FACTORS = (*GGUF_ROPE_FACTORS_RUN, GGUF_ROPE_FACTORS_LONG)
_LAYER = re.compile(r"blk\.(\d+)\.(.+)")
#: The layout of llama.cpp's first Mixtral GGUFs (which it still reads):
#: one 2-D tensor per expert and projection, `blk.L.ffn_gate.E.weight`.
_LEGACY_EXPERT = re.compile(r"ffn_(gate|up|down)\.(\d+)\.weight")


def fused_names(config: TransformerConfig, packed: set[str]) -> set[str]:
    """The fused Phi-3 weights whose parts are all in `packed` (so the fused
    tensor comes as blocks, to be split by rows)."""
    if config.model_type != "phi3":
        return set()
    fused = set()
    for i in range(config.num_layers):
        layer = f"model.layers.{i}"
        if {f"{layer}.self_attn.{p}_proj.weight" for p in "qkv"} <= packed:
            fused.add(f"{layer}.self_attn.qkv_proj.weight")
        if {f"{layer}.mlp.gate_proj.weight", f"{layer}.mlp.up_proj.weight"} <= packed:
            fused.add(f"{layer}.mlp.gate_up_proj.weight")
    return fused


def split_fused(tensors: Iterator[tuple[str, str, Any]], config: TransformerConfig) -> Iterator[tuple[str, str, Any]]:
    """Phi-3's fused `qkv_proj` and `gate_up_proj` weights as the separate
    projections the decoder holds: rows `[q; k; v]` and `[gate; up]`, split
    without copying (a tensor's or an array's row slices, or a slice of the
    block rows); other tensors pass through."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    for name, source, array in tensors:
        if name.endswith("self_attn.qkv_proj.weight"):
            prefix, bounds = (
                name.removesuffix("qkv_proj.weight"),
                [("q", 0, q), ("k", q, q + kv), ("v", q + kv, q + 2 * kv)],
            )
        elif name.endswith("mlp.gate_up_proj.weight"):
            inter = config.intermediate_size
            prefix, bounds = name.removesuffix("gate_up_proj.weight"), [("gate", 0, inter), ("up", inter, 2 * inter)]
        else:
            yield name, source, array
            continue
        rows = array.shape[0]
        if rows != bounds[-1][2]:
            raise CheckpointError(f"{source}: tensor {name} has {rows} rows, the config needs {bounds[-1][2]}")
        for part, start, end in bounds:
            if isinstance(array, GgufBlocks):
                piece = GgufBlocks(array.type, (end - start, array.shape[1]), array.rows[start:end])
            else:
                piece = array[start:end]
            yield f"{prefix}{part}_proj.weight", source, piece


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's conversion permutation of Q/K rows (it interleaves
    the two rotary halves of each head for its RoPE kernel)."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensors(spec: ModelSpec, raw: set[str]) -> Iterator[tuple[str, str, np.ndarray | GgufBlocks]]:
    """The GGUF's tensors by Hugging Face name, dequantized (float32, or
    float16 as stored); those named in
    `raw` whose type the Rust kernel reads come as GgufBlocks instead (a view
    of the file, or for the permuted Q/K rows a copy of the blocks). A 3-D
    tensor of experts comes as each expert's weight, in expert order: its
    rows of the file's blocks, or dequantized one expert at a time. Logs
    once which types of `raw` tensors the kernel does not read (F32 aside)."""
    path = spec.weights_path
    config = spec.transformer
    # llama.cpp's converter permutes the Q/K rows of every LlamaModel it
    # writes (Mixtral is its `llama`).
    permute = config.model_type in ("llama", "mistral", "granite", "smollm3", "mixtral")
    gemma = config.model_type == "gemma3_text"
    layer_names = gguf_layer_names(config)
    header = read_header(path)
    # A plain ndarray over the map: numpy.memmap slices cost a Python call each.
    data = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
    dequantized: set[str] = set()
    for tensor in header.tensors.values():
        name = hf_name(tensor.name, layer_names)
        if name is None:
            raise CheckpointError(f"{path}: unexpected tensor {tensor.name}")
        raw_bytes = data[tensor.offset : tensor.offset + tensor.num_bytes]
        if len(tensor.shape) == 3 and ".experts." in name:
            experts = [_expert_name(name, e) for e in range(tensor.shape[0])]
            blocks = experts[0] in raw and kernel_reads(tensor.type, tensor.shape[2])
            if experts[0] in raw and not blocks and tensor.type_name != "F32":
                dequantized.add(tensor.type_name)
            yield from ((n, path, w) for n, w in zip(experts, _experts(tensor, raw_bytes, blocks), strict=True))
            continue
        blocks = name in raw and len(tensor.shape) == 2 and kernel_reads(tensor.type, tensor.shape[1])
        if name in raw and not blocks and tensor.type_name != "F32":
            dequantized.add(tensor.type_name)
        if blocks:
            # A row of blocks is a row of weights: the Q/K row permutation
            # below applies to it as it is.
            array = raw_bytes.reshape(tensor.shape[0], -1)
        else:
            array = _dequantize(tensor, raw_bytes).reshape(tensor.shape)
        if permute and tensor.name.endswith(".attn_q.weight"):
            array = unpermute_qk(array, config.num_heads)
        elif permute and tensor.name.endswith(".attn_k.weight"):
            array = unpermute_qk(array, config.num_kv_heads)
        if gemma and name.endswith("norm.weight"):
            # llama.cpp stores Gemma's `1 + weight`; subtracting 1 in float32
            # gives the weight transformers loads from the same file.
            array = array.astype(np.float32) - 1.0
        if name.endswith("mlp.shared_expert_gate.weight") and array.ndim == 1:
            # llama.cpp's converter squeezed the `[1, hidden]` gate to 1-D
            # (its later versions keep it 2-D).
            array = array.reshape(1, -1)
        if blocks:
            # The file's own pages unless permuted (then a copy of the blocks).
            yield name, path, GgufBlocks(tensor.type, tensor.shape, np.ascontiguousarray(array))
        else:
            # A copy: the memory map is read-only, and the model owns its weights.
            yield name, path, np.array(array)
    if dequantized:
        logger.info(
            "%s: the kernel does not read %s weights in place: they are dequantized to float32",
            path, ", ".join(sorted(dequantized)),
        )  # fmt: skip


def _dequantize(tensor: GgufTensor, raw_bytes: np.ndarray) -> np.ndarray:
    """`raw_bytes` (whole rows of `tensor`'s type) as float32, or float16
    as stored; flat or `[rows, row]`."""
    if tensor.type_name == "F32":
        return raw_bytes.view(np.float32)
    if tensor.type_name == "F16":
        return raw_bytes.view(np.float16)
    import gguf

    rows = raw_bytes.size // (tensor.num_bytes // (tensor.num_elements // tensor.shape[-1]))
    return gguf.quants.dequantize(raw_bytes.reshape(rows, -1), gguf.GGMLQuantizationType(tensor.type))


def _experts(tensor: GgufTensor, raw_bytes: np.ndarray, blocks: bool) -> Iterator[np.ndarray | GgufBlocks]:
    """Each expert's `[out, in]` weight of a 3-D `[experts, out, in]` tensor:
    expert e is rows `[e * out, (e + 1) * out)` of its rows of blocks, kept
    as the file's pages (`blocks`) or dequantized (a copy)."""
    experts, out, width = tensor.shape
    rows = raw_bytes.reshape(experts * out, -1)
    for e in range(experts):
        mine = rows[e * out : (e + 1) * out]
        if blocks:
            yield GgufBlocks(tensor.type, (out, width), mine)
        else:
            yield np.array(_dequantize(tensor, mine).reshape(out, width))


def _expert_name(stacked: str, expert: int) -> str:
    """`model.layers.L.mlp.experts.P.weight` -> `model.layers.L.mlp.experts.{expert}.P.weight`."""
    prefix, _, projection = stacked.partition(".experts.")
    return f"{prefix}.experts.{expert}.{projection}"


def gguf_layer_names(config: TransformerConfig) -> dict[str, str]:
    """The per-layer GGUF -> Hugging Face name table of `config`'s architecture."""
    if config.moe is not None:
        return GGUF_MOE_LAYER_NAMES
    return {"gemma3_text": GGUF_GEMMA3_LAYER_NAMES, "phi3": GGUF_PHI3_LAYER_NAMES}.get(
        config.model_type, GGUF_LAYER_NAMES
    )


def hf_name(gguf_name: str, layer_names: dict[str, str]) -> str | None:
    """The Hugging Face name of a GGUF tensor (GGUF_ROPE_FREQS keeps its
    own; `layer_names`: the architecture's per-layer names), None for an
    unknown one."""
    if gguf_name in GGUF_ROPE_FACTORS:
        return gguf_name
    name = GGUF_NAMES.get(gguf_name)
    if name is None and (match := _LAYER.fullmatch(gguf_name)):
        suffix = layer_names.get(match.group(2))
        if suffix is None and layer_names is GGUF_MOE_LAYER_NAMES:
            legacy = _LEGACY_EXPERT.fullmatch(match.group(2))
            suffix = legacy and f"mlp.experts.{legacy.group(2)}.{legacy.group(1)}_proj.weight"
        name = suffix and f"model.layers.{match.group(1)}.{suffix}"
    return name
