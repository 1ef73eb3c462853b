"""The native executor: a Llama-family GGUF on the CPU run by the native
step without torch. The file's tensors are read by their Hugging Face names
(`gguf_weights.gguf_tensors`: the linear weights as the file's own blocks),
the KV cache is anonymous memory that becomes resident as blocks are
written, and each staged step is one `NativeStep.forward`. An engine that
runs it never imports torch (about 600 MiB and seconds of start-up saved).
Where the file holds anything the native step does not run (a tensor of a
type the kernel does not read in place, another architecture's layers), it
raises NativeStepUnsupported and the runner takes the torch executor, which
runs the same model as torch modules."""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from vllm_rs.engine.config import EngineConfig, kv_cache_dtype
from vllm_rs.engine.cpu_threads import kernel_threads, limit_cpu_threads
from vllm_rs.engine.layers.gguf_blocks import GgufBlocks, GgufRows, kernel_reads
from vllm_rs.engine.layers.rope_frequencies import long_rope_after, rope_inv_freq
from vllm_rs.engine.model_loader.gguf_file import GgufTensor, read_header
from vllm_rs.engine.model_loader.gguf_weights import (
    GGUF_ROPE_FACTORS,
    GGUF_ROPE_FACTORS_LONG,
    GGUF_ROPE_FACTORS_RUN,
    fused_names,
    gguf_layer_names,
    gguf_tensors,
    hf_name,
    split_fused,
)
from vllm_rs.engine.worker.native_step import NativeStep, decoder_weight_shapes, linear_names
from vllm_rs.engine.worker.step_inputs import StagedStep, StepInputs
from vllm_rs.logger import init_logger

logger = init_logger(__name__)

#: numpy's view of each KV cache dtype: 16-bit caches are handed over as bits.
_CACHE_ARRAY_DTYPES = {"float32": np.float32, "float16": np.uint16, "bfloat16": np.uint16}


class NativeStepUnsupported(Exception):
    """The model cannot run as a torch-free native step (says why)."""


def _unsupported_by_config(config: EngineConfig) -> str | None:
    """Why the configuration rules the native executor out before any file
    is read (None when only the file's tensors can say)."""
    model = config.model_config
    if not model.spec.is_gguf:
        return "not a GGUF file"
    if model.quantization != "gguf":
        return f"--quantization {model.quantization}"
    if config.device_config.device != "cpu" or model.dtype != "float32":
        return f"it runs on the CPU in float32, not {config.device_config.device} in {model.dtype}"
    if model.enforce_eager:
        return "--enforce-eager"
    if kv_cache_dtype(config.cache_config, model.dtype) not in _CACHE_ARRAY_DTYPES:
        return f"--kv-cache-dtype {config.cache_config.cache_dtype}"
    return None


def _weight_names(name: str | None, tensor: GgufTensor) -> list[str | None]:
    """The Hugging Face weights a GGUF tensor (named `name`) holds: its one,
    or each expert's where a layer's experts are stacked in one 3-D tensor
    per projection (`ffn_*_exps`, which `gguf_tensors` splits)."""
    if name is not None and len(tensor.shape) == 3 and ".mlp.experts." in name:
        return [name.replace(".mlp.experts.", f".mlp.experts.{e}.") for e in range(tensor.shape[0])]
    return [name]


def _cache_arrays(num_slots: int, kv_heads: int, head_dim: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """One layer's key and value arrays `[num_slots, kv_heads, head_dim]` in
    fresh anonymous memory: untouched pages cost nothing until a block is
    written (a plain `np.empty` of this size may be backed by huge pages,
    which makes one written block cost 2 MiB). Never zeroed: attention reads
    only the slots its sequence wrote."""
    shape = (2, num_slots, kv_heads, head_dim)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    cache = np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(shape)
    return cache[0], cache[1]


class NativeExecutor:
    """A Llama-family GGUF's native step with its KV cache and host inputs;
    `forward` gives a staged step's logits. Raises NativeStepUnsupported
    where the file holds what it does not run."""

    #: Where the model runs (the engine reports it).
    device = "cpu"

    def __init__(self, config: EngineConfig):
        why_not = _unsupported_by_config(config)
        if why_not is not None:
            raise NativeStepUnsupported(why_not)
        model = config.model_config
        spec = model.spec
        c = spec.transformer
        #: The file's weights by Hugging Face name (the linear ones as the
        #: kernel's blocks), as the native step reads them.
        self.weights, rope_factors = self._read_weights(spec)
        limit_cpu_threads(config)
        self.block_size = config.cache_config.block_size
        self.num_gpu_blocks = config.cache_config.num_gpu_blocks
        cache_dtype = kv_cache_dtype(config.cache_config, model.dtype)
        slots = self.num_gpu_blocks * self.block_size
        self.kv_caches = [
            _cache_arrays(slots, c.num_kv_heads, c.head_dim, _CACHE_ARRAY_DTYPES[cache_dtype])
            for _ in range(c.num_layers)
        ]
        header = read_header(spec.weights_path)
        #: The token embeddings, looked up in the file.
        self.embeddings = GgufRows(spec.weights_path, header.tensors["token_embd.weight"])
        self.native_step = NativeStep(
            c, self.weights, rope_inv_freq(c, rope_factors), self.embeddings.lookup, self.kv_caches, cache_dtype,
            model.kernel_precision,
        )  # fmt: skip
        sched = config.scheduler_config
        self.inputs = StepInputs.allocate(
            self.block_size, sched.max_num_batched_tokens, sched.max_num_seqs, model.max_model_len,
            len(spec.kv_groups), long_rope_after(c),
        )  # fmt: skip
        logger.info(
            "%s (%s, weights kept as stored) on cpu (kernels %d): %d KV blocks of %d tokens%s; native step (no torch)",
            model.architecture, model.dtype, kernel_threads(), self.num_gpu_blocks, self.block_size,
            "" if cache_dtype == model.dtype else f" ({cache_dtype})",
        )  # fmt: skip

    @staticmethod
    def _read_weights(spec: Any) -> tuple[dict[str, Any], np.ndarray | None]:
        """The file's weights by Hugging Face name, and its RoPE factors;
        NativeStepUnsupported where they are not exactly a `llama.CausalLM`'s
        with every linear weight in blocks the kernel reads."""
        c = spec.transformer
        expected = decoder_weight_shapes(c)
        linears = set(linear_names(c))
        in_blocks = linears | fused_names(c, linears)
        # Decided from the header, before any tensor is read (or dequantized
        # and logged, which the torch executor would then do again).
        layer_names = gguf_layer_names(c)
        known = set(expected) | in_blocks | {"lm_head.weight", *GGUF_ROPE_FACTORS}
        for tensor in read_header(spec.weights_path).tensors.values():
            name = hf_name(tensor.name, layer_names)
            names = _weight_names(name, tensor)
            if any(n not in known for n in names):
                raise NativeStepUnsupported(f"the file holds {tensor.name}, which the native step does not run")
            if any(n in in_blocks for n in names) and not kernel_reads(tensor.type, tensor.shape[-1]):
                raise NativeStepUnsupported(f"the kernel does not read {tensor.name}'s {tensor.type_name} in place")
        # The embeddings stay in the file (GgufRows): never dequantized here.
        tensors = gguf_tensors(spec, in_blocks | {"model.embed_tokens.weight"})
        if c.model_type == "phi3":
            tensors = split_fused(tensors, c)
        weights: dict[str, Any] = {}
        rope_factors = None
        for name, _, array in tensors:
            if name in GGUF_ROPE_FACTORS_RUN:
                rope_factors = np.asarray(array, dtype=np.float32)
            elif name == GGUF_ROPE_FACTORS_LONG:
                continue
            elif name == "lm_head.weight" and c.tie_word_embeddings:
                continue
            elif name not in expected:
                raise NativeStepUnsupported(f"the file holds {name}, which the native step does not run")
            elif tuple(array.shape) != expected[name]:
                raise NativeStepUnsupported(f"{name} has shape {tuple(array.shape)}, not {expected[name]}")
            else:
                weights[name] = array
        missing = sorted(set(expected) - set(weights))
        if missing:
            raise NativeStepUnsupported(f"the file lacks {', '.join(missing[:3])}")
        dense = sorted(name for name in linears if not isinstance(weights[name], GgufBlocks))
        if dense:
            raise NativeStepUnsupported(f"some weights are not held as blocks the kernel reads ({dense[0]})")
        return weights, rope_factors

    def forward(self, staged: StagedStep) -> np.ndarray:
        """The float32 logits `[staged.num_rows, vocab]` of a staged step."""
        n, inputs = staged.num_tokens, self.inputs
        return self.native_step.forward(
            inputs.input_ids[:n], inputs.positions[:n], inputs.slot_mapping[:n],
            inputs.key_starts[:n], inputs.key_slots[: staged.num_keys], inputs.logits_indices[: staged.num_rows],
            inputs.long_rope_flags(n), [(slots[:n], keys[: staged.num_keys]) for slots, keys in inputs.group_slots],
        )  # fmt: skip
