"""Loading a real model's weights into its module (`llama.CausalLM`, or
`gemma3.Gemma3ForCausalLM`): safetensors files
(memory-mapped with `safetensors.safe_open`) by their Hugging Face names
(Mixtral's `block_sparse_moe.experts.E.w1` read as `mlp.experts.E.gate_proj`), or
a GGUF file's tensors by the same names (`gguf_weights.gguf_tensors`).
Every tensor is cast to the model dtype and moved to
the device as it is read; with `--quantization gguf` the linear layers'
weights stay in the file's blocks or are packed instead (`packed_weights`)
and the embeddings stay in the file."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Iterator

import numpy as np
import torch

from vllm_rs.engine.config import HALF_IN_PLACE
from vllm_rs.engine.layers.packed_weights import (
    HalfEmbedding,
    PackedLinear,
    half_blocks,
    pack_linears,
)
from vllm_rs.engine.model_loader.checkpoint import CheckpointError
from vllm_rs.engine.model_loader.gguf_file import read_header
from vllm_rs.engine.model_loader.gguf_weights import (
    GGUF_ROPE_FACTORS_LONG,
    GGUF_ROPE_FACTORS_RUN,
    fused_names,
    gguf_tensors,
    split_fused,
)
from vllm_rs.engine.model_loader.registry import ModelSpec
from vllm_rs.engine.models.gemma3 import Gemma3ForCausalLM
from vllm_rs.engine.models.llama import CausalLM

#: Hugging Face `model_type` -> its module, where not `llama.CausalLM`.
MODEL_CLASSES = {"gemma3_text": Gemma3ForCausalLM}


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
        raw = set(packed) | fused_names(spec.transformer, set(packed))
        if packed:
            # Looked up in the file (GgufEmbedding): not dequantized here.
            raw.add("model.embed_tokens.weight")
        tensors = gguf_tensors(spec, raw)
    else:
        if quantization == HALF_IN_PLACE:
            packed = pack_linears(model, None, None)
        tensors = _safetensors_tensors(spec.weight_files)
        if spec.transformer.architecture == "Gemma3ForConditionalGeneration":
            tensors = _text_part(tensors)
        elif spec.transformer.model_type == "mixtral":
            tensors = _mixtral_names(tensors)
        where = ", ".join(spec.weight_files)
    if spec.transformer.model_type == "phi3":
        tensors = split_fused(tensors, spec.transformer)
    expected = {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}
    expected.update((name, layer.weight_shape) for name, layer in packed.items())
    if packed:
        expected.setdefault("model.embed_tokens.weight", (spec.transformer.vocab_size, spec.transformer.hidden_size))
    state: dict[str, torch.Tensor] = {}
    loaded: set[str] = set()
    for name, source, array in tensors:
        if name in GGUF_ROPE_FACTORS_RUN:
            rope_factors = np.asarray(array, dtype=np.float32)
            continue
        if isinstance(array, np.ndarray):
            array = torch.from_numpy(array)
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


#: Mixtral's checkpoint names -> the decoder's (its experts are MLPs with
#: w1 the gate, w3 the up and w2 the down projection).
_MIXTRAL_NAMES = re.compile(r"(model\.layers\.\d+\.)block_sparse_moe\.(gate\.weight|experts\.\d+\.)(w[123]\.weight)?")
_MIXTRAL_EXPERT_NAMES = {
    "w1.weight": "gate_proj.weight",
    "w2.weight": "down_proj.weight",
    "w3.weight": "up_proj.weight",
}


def _mixtral_names(tensors: Iterator[tuple[str, str, torch.Tensor]]) -> Iterator[tuple[str, str, torch.Tensor]]:
    """A Mixtral checkpoint's tensors by the names of the decoder's routed
    experts (`block_sparse_moe.` -> `mlp.`)."""
    for name, source, tensor in tensors:
        match = _MIXTRAL_NAMES.fullmatch(name)
        if match is not None:
            layer, part, weight = match.groups()
            name = f"{layer}mlp.{part}{_MIXTRAL_EXPERT_NAMES.get(weight, '')}"
        yield name, source, tensor


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
