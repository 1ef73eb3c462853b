"""Loading a real model's weights into its module (`llama.CausalLM`, or
`gemma3.Gemma3ForCausalLM`): safetensors files
(memory-mapped with `safetensors.safe_open`) by their Hugging Face names, or
a GGUF file's tensors (dequantized with the `gguf` package), renamed to the
Hugging Face names with llama.cpp's Q/K row permutation undone for the
`llama` architecture and the 1 its converter adds to Gemma's norms taken
off again. Every tensor is cast to the model dtype and moved to
the device as it is read; with `--quantization gguf` the linear layers'
weights stay in the file's blocks or are packed instead (`packed_weights`)
and the embeddings stay in the file."""

from __future__ import annotations

import ctypes
import logging
import re
from collections.abc import Iterator

import numpy as np
import torch

from vllm_rs.engine.config import HALF_IN_PLACE
from vllm_rs.engine.layers.packed_weights import (
    GgufBlocks,
    HalfEmbedding,
    PackedLinear,
    half_blocks,
    kernel_reads,
    pack_linears,
)
from vllm_rs.engine.model_loader.checkpoint import CheckpointError
from vllm_rs.engine.model_loader.gguf_file import read_header
from vllm_rs.engine.model_loader.registry import ModelSpec
from vllm_rs.engine.models.gemma3 import Gemma3ForCausalLM
from vllm_rs.engine.models.llama import CausalLM

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
#: A `phi3` GGUF's LongRoPE factors: the short ones are run, the long ones
#: (beyond the original context, which the engine does not reach) are not.
GGUF_ROPE_FACTORS_SHORT = "rope_factors_short.weight"
GGUF_ROPE_FACTORS_LONG = "rope_factors_long.weight"
#: Hugging Face `model_type` -> its module, where not `llama.CausalLM`.
MODEL_CLASSES = {"gemma3_text": Gemma3ForCausalLM}
#: llama.cpp's per-layer RoPE frequency factors (Llama 3.1's scaling).
GGUF_ROPE_FREQS = "rope_freqs.weight"
_LAYER = re.compile(r"blk\.(\d+)\.(.+)")


def load_model(
    spec: ModelSpec, dtype: torch.dtype, device: torch.device, quantization: str | None = None
) -> CausalLM | Gemma3ForCausalLM:
    """The model of `spec` with its weights in `dtype` on `device` (with
    `quantization` "gguf": a GGUF's linear weights kept in the file's blocks
    where the Rust kernel reads their type, its embeddings read from the
    file; HALF_IN_PLACE: a safetensors checkpoint's float16/bfloat16 linear
    weights and embeddings kept as stored); raises CheckpointError naming the file
    when a tensor is missing, unexpected, misshapen or unreadable."""
    model = MODEL_CLASSES.get(spec.transformer.model_type, CausalLM).build(spec.transformer)
    rope_factors = None
    packed: dict[str, PackedLinear] = {}
    if spec.is_gguf:
        where = spec.weights_path
        if quantization == "gguf":
            embeddings = read_header(where).tensors["token_embd.weight"]
            packed = pack_linears(model, where, embeddings)
        tensors = _gguf_tensors(spec, set(packed) | _fused_names(spec.transformer, set(packed)))
    else:
        if quantization == HALF_IN_PLACE:
            packed = pack_linears(model, None, None)
        tensors = _safetensors_tensors(spec.weight_files)
        if spec.transformer.architecture == "Gemma3ForConditionalGeneration":
            tensors = _text_part(tensors)
        where = ", ".join(spec.weight_files)
    if spec.transformer.model_type == "phi3":
        tensors = _split_fused(tensors, spec.transformer)
    expected = {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}
    expected.update((name, layer.weight_shape) for name, layer in packed.items())
    if packed:
        expected.setdefault("model.embed_tokens.weight", (spec.transformer.vocab_size, spec.transformer.hidden_size))
    state: dict[str, torch.Tensor] = {}
    loaded: set[str] = set()
    for name, source, array in tensors:
        if name in (GGUF_ROPE_FREQS, GGUF_ROPE_FACTORS_SHORT):
            rope_factors = array.float()
            continue
        if name == GGUF_ROPE_FACTORS_LONG:
            continue
        if name not in expected:
            if name.endswith("rotary_emb.inv_freq") or (
                name == "lm_head.weight" and spec.transformer.tie_word_embeddings
            ):
                continue
            raise CheckpointError(f"{source}: unexpected tensor {name}")
        if tuple(array.shape) != expected[name]:
            raise CheckpointError(
                f"{source}: tensor {name} has shape {tuple(array.shape)}, the config needs {expected[name]}"
            )
        if name in packed:
            # A safetensors half weight as the kernel's F16/BF16 rows (no copy).
            packed[name].load_weight(half_blocks(array) if isinstance(array, torch.Tensor) else array)
            loaded.add(name)
        if packed and name == "model.embed_tokens.weight":
            if spec.is_gguf:
                loaded.add(name)  # looked up in the file by GgufEmbedding
            elif array.dtype in (torch.float16, torch.bfloat16):
                model.model.embed_tokens = HalfEmbedding(array)
                loaded.add(name)
            else:
                state[name] = array.to(device=device, dtype=dtype)
        elif name not in packed:
            state[name] = array.to(device=device, dtype=dtype)
    missing = sorted(set(expected) - set(state) - loaded)
    if missing:
        raise CheckpointError(f"{where}: missing tensors {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    model.load_state_dict(state, assign=True)
    model.init_rope(device, rope_factors)
    release_freed_memory()
    return model.eval()


def _fused_names(config, packed: set[str]) -> set[str]:
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


def _split_fused(tensors: Iterator[tuple[str, str, torch.Tensor | GgufBlocks]], config):
    """Phi-3's fused `qkv_proj` and `gate_up_proj` weights as the separate
    projections the decoder holds: rows `[q; k; v]` and `[gate; up]`, split
    without copying (a tensor's row slices, or a slice of the block rows)."""
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


def release_freed_memory() -> None:
    """Hands the heap memory freed during the load (the dequantized
    temporaries of every tensor) back to the system: glibc keeps freed
    chunks of that size in its heap otherwise, which stays resident.
    A no-op where the C library has no `malloc_trim`."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _safetensors_tensors(files: list[str]) -> Iterator[tuple[str, str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    for path in files:
        try:
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    yield name, path, f.get_tensor(name)
        except SafetensorError as e:
            raise CheckpointError(f"{path}: cannot read safetensors file: {e}") from None


#: A multimodal checkpoint's text decoder, as Hugging Face checkpoints
#: (`language_model.model.`) and transformers' own modules
#: (`model.language_model.`) name it; the vision tower and projector are
#: skipped.
_TEXT_PREFIXES = (("language_model.", ""), ("model.language_model.", "model."))
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def _text_part(tensors: Iterator[tuple[str, str, torch.Tensor]]) -> Iterator[tuple[str, str, torch.Tensor]]:
    """The text decoder's tensors of a multimodal checkpoint, by the names
    of the text-only model."""
    for name, source, tensor in tensors:
        if name.startswith(_VISION_PREFIXES):
            continue
        prefix, replacement = next(((p, r) for p, r in _TEXT_PREFIXES if name.startswith(p)), ("", ""))
        yield replacement + name[len(prefix) :], source, tensor


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's conversion permutation of Q/K rows (it interleaves
    the two rotary halves of each head for its RoPE kernel)."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _gguf_tensors(spec: ModelSpec, raw: set[str]) -> Iterator[tuple[str, str, torch.Tensor | GgufBlocks]]:
    """The GGUF's tensors by Hugging Face name, dequantized; those named in
    `raw` whose type the Rust kernel reads come as GgufBlocks instead (a view
    of the file, or for the permuted Q/K rows a copy of the blocks). Logs
    once which types of `raw` tensors the kernel does not read (F32 aside)."""
    import gguf

    path = spec.weights_path
    config = spec.transformer
    # llama.cpp's converter permutes the Q/K rows of every LlamaModel it writes.
    permute = config.model_type in ("llama", "mistral", "granite", "smollm3")
    gemma = config.model_type == "gemma3_text"
    layer_names = {"gemma3_text": GGUF_GEMMA3_LAYER_NAMES, "phi3": GGUF_PHI3_LAYER_NAMES}.get(
        config.model_type, GGUF_LAYER_NAMES
    )
    header = read_header(path)
    # A plain ndarray over the map: numpy.memmap slices cost a Python call each.
    data = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
    dequantized: set[str] = set()
    for tensor in header.tensors.values():
        name = _hf_name(tensor.name, layer_names)
        if name is None:
            raise CheckpointError(f"{path}: unexpected tensor {tensor.name}")
        raw_bytes = data[tensor.offset : tensor.offset + tensor.num_bytes]
        blocks = name in raw and len(tensor.shape) == 2 and kernel_reads(tensor.type, tensor.shape[1])
        if name in raw and not blocks and tensor.type_name != "F32":
            dequantized.add(tensor.type_name)
        if blocks:
            # A row of blocks is a row of weights: the Q/K row permutation
            # below applies to it as it is.
            array = raw_bytes.reshape(tensor.shape[0], -1)
        elif tensor.type_name == "F32":
            array = raw_bytes.view(np.float32)
        elif tensor.type_name == "F16":
            array = raw_bytes.view(np.float16)
        else:
            rows = tensor.num_elements // tensor.shape[-1]
            array = gguf.quants.dequantize(raw_bytes.reshape(rows, -1), gguf.GGMLQuantizationType(tensor.type))
        if not blocks:
            array = array.reshape(tensor.shape)
        if permute and tensor.name.endswith(".attn_q.weight"):
            array = unpermute_qk(array, config.num_heads)
        elif permute and tensor.name.endswith(".attn_k.weight"):
            array = unpermute_qk(array, config.num_kv_heads)
        if gemma and name.endswith("norm.weight"):
            # llama.cpp stores Gemma's `1 + weight`; subtracting 1 in float32
            # gives the weight transformers loads from the same file.
            array = array.astype(np.float32) - 1.0
        if blocks:
            # The file's own pages unless permuted (then a copy of the blocks).
            yield name, path, GgufBlocks(tensor.type, tensor.shape, np.ascontiguousarray(array))
        else:
            # A copy: the memory map is read-only, and the model owns its weights.
            yield name, path, torch.from_numpy(np.array(array))
    if dequantized:
        logger.info(
            "%s: the kernel does not read %s weights in place: they are dequantized to float32",
            path, ", ".join(sorted(dequantized)),
        )  # fmt: skip


def _hf_name(gguf_name: str, layer_names: dict[str, str]) -> str | None:
    """The Hugging Face name of a GGUF tensor (GGUF_ROPE_FREQS keeps its
    own; `layer_names`: the architecture's per-layer names), None for an
    unknown one."""
    if gguf_name in (GGUF_ROPE_FREQS, GGUF_ROPE_FACTORS_SHORT, GGUF_ROPE_FACTORS_LONG):
        return gguf_name
    name = GGUF_NAMES.get(gguf_name)
    if name is None and (match := _LAYER.fullmatch(gguf_name)):
        suffix = layer_names.get(match.group(2))
        name = suffix and f"model.layers.{match.group(1)}.{suffix}"
    return name
