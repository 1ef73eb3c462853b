"""The torch executor: a model (the toy model or a real one) as torch
modules on the CPU or a CUDA device, its KV cache allocated per layer and
bound with `bind_kv_cache`, each step's staged inputs copied to the device
(`CpuGpuBuffer`s), one forward pass over every scheduled request (prefill
chunks and decodes together), run as the native step where
`native_step_unsupported` finds nothing against it. Where the native step
needs no torch at all (a GGUF on the CPU), `native_executor` runs instead."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from vllm_rs.engine.config import EngineConfig, EngineConfigError, kv_bytes_per_token, kv_cache_dtype
from vllm_rs.engine.cpu_threads import keep_torch_on_one_thread, kernel_threads, limit_cpu_threads
from vllm_rs.engine.kv_cache.kv_cache_manager import blocks_held_at_most
from vllm_rs.engine.layers.attention import AttentionMetadata, DecodeBatch, SequenceSlice, attends_in_place
from vllm_rs.engine.layers.layernorm import GemmaRMSNorm, RMSNorm
from vllm_rs.engine.layers.packed_weights import PackedLinear, every_matmul_in_kernels
from vllm_rs.engine.layers.rope_frequencies import long_rope_after
from vllm_rs.engine.models.gemma3 import Gemma3ForCausalLM
from vllm_rs.engine.models.llama import CausalLM
from vllm_rs.engine.models.toy_model import ToyConfig, ToyDecoder
from vllm_rs.engine.worker.native_step import NativeStep, head_name
from vllm_rs.engine.worker.step_inputs import StagedStep, StepInputs, step_array_sizes
from vllm_rs.logger import init_logger
from vllm_rs.tensor_utils import CpuGpuBuffer, bind_kv_cache

logger = init_logger(__name__)


def resolve_device(name: str) -> torch.device:
    """`auto` -> CUDA when available, else CPU; `cuda` without CUDA raises
    RuntimeError."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: CUDA is not available")
    return torch.device(name)


class KVCacheTooSmallError(RuntimeError):
    """The device's free memory holds no full sequence's KV cache."""


#: Fraction of a CUDA device's free memory (after the weights) the KV cache
#: takes when no budget is given (vLLM's `gpu_memory_utilization` default).
CUDA_KV_FRACTION = 0.9


def native_step_unsupported(model: nn.Module, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `model` cannot run as a native step (None when it can): it must be
    a `llama.CausalLM` itself (a mixture of experts included) or Gemma 3's
    (not another subclass with layers of its own), on the CPU in float32,
    every linear layer and the output head held as blocks the kernel reads,
    every norm float32."""
    if type(model) not in (CausalLM, Gemma3ForCausalLM):
        return f"{type(model).__name__} has layers of its own"
    if device.type != "cpu" or dtype != torch.float32:
        return f"it runs on the CPU in float32, not {device.type} in {str(dtype).removeprefix('torch.')}"
    linears = [m for m in model.modules() if isinstance(m, (nn.Linear, PackedLinear))]
    if not isinstance(getattr(model, "lm_head", None), PackedLinear) or any(
        not isinstance(m, PackedLinear) or m.blocks is None for m in linears
    ):
        return "some weights are not held as blocks the kernel reads (dense float32 weights)"
    if any(m.weight.dtype != torch.float32 for m in model.modules() if isinstance(m, (RMSNorm, GemmaRMSNorm))):
        return "its norms are not float32"
    return None


def native_step_from_module(model: CausalLM, precision: str) -> NativeStep:
    """The native step over `model`'s own weights (the same memory) and
    bound KV caches; only where `native_step_unsupported` is None."""
    weights: dict[str, object] = {
        name: tensor.detach().numpy() for name, tensor in model.state_dict().items() if tensor.dtype == torch.float32
    }
    for name, module in model.named_modules():
        if isinstance(module, PackedLinear):
            weights[f"{name}.weight"] = module.blocks
    weights[head_name(model.config)] = model.lm_head.blocks
    caches = [layer.self_attn.attn.cache_arrays() for layer in model.model.layers]
    cache_dtype = str(model.model.layers[0].self_attn.attn.kv_cache.dtype).removeprefix("torch.")
    embed = model.model.embed_tokens

    def lookup(ids: np.ndarray) -> np.ndarray:
        return embed(torch.from_numpy(ids)).numpy()

    return NativeStep(model.config, weights, model.inv_freq.numpy(), lookup, caches, cache_dtype, precision)


class TorchExecutor:
    """A model as torch modules with its KV cache and device buffers;
    `forward` gives a staged step's logits."""

    def __init__(self, config: EngineConfig):
        self.device = resolve_device(config.device_config.device)
        if self.device.type == "cpu":
            limit_cpu_threads(config)
        self.dtype = getattr(torch, config.model_config.dtype)
        #: What the KV cache holds (`--kv-cache-dtype`; `auto` is `dtype`).
        self.kv_dtype = getattr(torch, kv_cache_dtype(config.cache_config, config.model_config.dtype))
        self.model = self._load_model(config).to(self.device).eval()
        if self.device.type == "cpu" and every_matmul_in_kernels(self.model):
            keep_torch_on_one_thread()
        self.block_size = config.cache_config.block_size
        self.num_gpu_blocks = config.cache_config.num_gpu_blocks or self._blocks_from_free_memory(config)
        self.kv_caches: list[torch.Tensor] = []
        self._allocate_kv_cache()
        sched = config.scheduler_config
        sizes = step_array_sizes(sched.max_num_batched_tokens, sched.max_num_seqs, config.model_config.max_model_len)
        self._buffers = [CpuGpuBuffer(n, dtype=torch.int64, device=self.device) for n in sizes]
        self.input_ids, self.positions, slot_mapping, key_slots, _, self.logits_indices = self._buffers
        max_keys = sizes[3]
        self.decode_rows = CpuGpuBuffer(sched.max_num_seqs, dtype=torch.int64, device=self.device)
        self.decode_lens = CpuGpuBuffer(sched.max_num_seqs, dtype=torch.int64, device=self.device)
        # Each KV-cache group's slot mapping, key slots and padded decode key
        # slots: its layers read the same keys in blocks of its own.
        spec = config.model_config.spec
        self._groups = [(slot_mapping, key_slots)] + [
            (CpuGpuBuffer(sizes[2], dtype=torch.int64, device=self.device),
             CpuGpuBuffer(max_keys, dtype=torch.int64, device=self.device))
            for _ in spec.kv_groups[1:]
        ]  # fmt: skip
        self._decode_key_slots = [CpuGpuBuffer(max_keys, dtype=torch.int64, device=self.device) for _ in self._groups]
        groups = [(slots.np, keys.np) for slots, keys in self._groups]
        long_after = long_rope_after(spec.transformer) if isinstance(self.model, CausalLM) else None
        self.inputs = StepInputs(
            self.block_size, *(b.np for b in self._buffers), group_slots=groups[1:], long_rope_after=long_after
        )
        # The Rust decode kernel attends in place, also for one sequence;
        # torch's attention is batched only when there are several.
        self._decodes_in_place = attends_in_place(self.device, self.kv_dtype)
        # The sliding windows of the model's layers, each with its layers'
        # KV-cache group: each step is also staged as seen through each of
        # them, in that group's blocks (`AttentionMetadata.windows`).
        layers = self.model.attention_layers().values()
        windows = sorted({layer.sliding_window for layer in layers if layer.sliding_window is not None})
        c = spec.transformer
        group_of = {c.layer_window(i): c.kv_group(i) for i in range(c.num_layers)} if c is not None else {}
        self._windows = [(window, group_of.get(window, 0)) for window in windows]
        self.native_step: NativeStep | None = None
        why_not = "--enforce-eager" if config.model_config.enforce_eager else None
        why_not = why_not or native_step_unsupported(self.model, self.device, self.dtype)
        if why_not is None:
            self.native_step = native_step_from_module(self.model, config.model_config.kernel_precision)
        elif config.model_config.kernel_precision != "exact":
            raise EngineConfigError(
                f"--kernel-precision {config.model_config.kernel_precision} needs the native step, "
                f"which cannot run this model: {why_not}"
            )
        logger.info(
            "%s (%s%s) on %s (%d threads, kernels %d): %d KV blocks of %d tokens%s; %s",
            config.model_config.architecture, config.model_config.dtype,
            ", weights kept as stored" if config.model_config.quantization else "", self.device,
            torch.get_num_threads(), kernel_threads(),
            self.num_gpu_blocks, self.block_size,
            "" if self.kv_dtype == self.dtype else f" ({str(self.kv_dtype).removeprefix('torch.')})",
            "native step" if why_not is None else f"torch step ({why_not})",
        )  # fmt: skip

    def _load_model(self, config: EngineConfig) -> torch.nn.Module:
        spec = config.model_config.spec
        if spec.is_real:
            from vllm_rs.engine.model_loader.weights import load_model

            return load_model(spec, self.dtype, self.device, config.model_config.quantization)
        model = ToyDecoder(ToyConfig.from_hparams(spec.hparams))
        if spec.weights_path:
            model.load_state_dict(torch.load(spec.weights_path, map_location="cpu", weights_only=True))
        else:
            model.init_seeded()
        return model.to(self.dtype)

    def _blocks_from_free_memory(self, config: EngineConfig) -> int:
        """KV blocks for a CUDA device without a budget: `CUDA_KV_FRACTION`
        of its free memory, at most `max_num_seqs` full sequences."""
        kv_dtype = kv_cache_dtype(config.cache_config, config.model_config.dtype)
        block_bytes = kv_bytes_per_token(config.model_config.spec, kv_dtype) * self.block_size
        per_sequence = blocks_held_at_most(
            config.model_config.max_model_len, self.block_size, config.model_config.spec.kv_window,
            config.scheduler_config.max_num_batched_tokens,
        )  # fmt: skip
        free, _ = torch.cuda.mem_get_info(self.device)
        blocks = min(int(free * CUDA_KV_FRACTION) // block_bytes, per_sequence * config.scheduler_config.max_num_seqs)
        if blocks < per_sequence:
            raise KVCacheTooSmallError(
                f"{self.device} has {free} bytes free after the weights: no room for the KV cache of one sequence of "
                f"--max-model-len {config.model_config.max_model_len} ({per_sequence * block_bytes} bytes)"
            )
        return blocks

    def _allocate_kv_cache(self) -> None:
        """Allocates each layer's cache untouched: on the CPU a large
        `torch.empty` is fresh anonymous memory whose pages become resident
        when first written, so the cache costs what the blocks in use hold,
        not the budget. Never zeroed: attention reads only slots that their
        sequence wrote (`_stage_decodes` points the padding at such a slot)."""
        forward_context = self.model.attention_layers()
        kv_caches = {
            name: torch.empty(
                layer.cache_shape(self.num_gpu_blocks, self.block_size), dtype=self.kv_dtype, device=self.device
            )
            for name, layer in forward_context.items()
        }
        bind_kv_cache(kv_caches, forward_context, self.kv_caches)

    @torch.inference_mode()
    def forward(self, staged: StagedStep) -> np.ndarray:
        """The float32 logits `[staged.num_rows, vocab]` of a staged step,
        on the host."""
        n, rows = staged.num_tokens, staged.num_rows
        if self.native_step is not None:
            inputs = self.inputs
            return self.native_step.forward(
                inputs.input_ids[:n], inputs.positions[:n], inputs.slot_mapping[:n],
                inputs.key_starts[:n], inputs.key_slots[: staged.num_keys], inputs.logits_indices[:rows],
                inputs.long_rope_flags(n), [(slots[:n], keys[: staged.num_keys]) for slots, keys in inputs.group_slots],
            )  # fmt: skip
        logits = self.model(
            self.input_ids.copy_to_gpu(n),
            self.positions.copy_to_gpu(n),
            self._attention_metadata(staged, n),
            self.logits_indices.copy_to_gpu(rows),
        )
        return logits.float().cpu().numpy()

    def _attention_metadata(self, staged: StagedStep, num_tokens: int) -> AttentionMetadata:
        """The torch path's view of a staged step: each sequence's keys and
        causal mask, the decodes batched, and each sliding window's view."""
        ranges, key_row = staged.ranges, staged.num_keys
        decodes = [r for r in ranges if r[1] - r[0] == 1]
        batch_decodes = len(decodes) > 1 or (decodes and self._decodes_in_place)
        # Each group's (slot mapping, key slots, decode batch) on the device.
        groups = []
        for (slots, keys), padded in zip(self._groups, self._decode_key_slots, strict=True):
            batched = self._stage_decodes(decodes, keys.np, padded) if batch_decodes else None
            groups.append((slots.copy_to_gpu(num_tokens), keys.copy_to_gpu(key_row), batched))
        slot_mapping, key_slots_gpu, batched = groups[0]
        sequences = []
        for start, end, key_start, seq_len, context in ranges:
            if batched is not None and end - start == 1:
                continue
            mask = None
            if end - start > 1:
                query_pos = torch.arange(context, seq_len, device=self.device)
                mask = torch.arange(seq_len, device=self.device)[None, :] <= query_pos[:, None]
            sequences.append(SequenceSlice(start, end, key_slots_gpu[key_start : key_start + seq_len], mask))
        meta = AttentionMetadata(slot_mapping, sequences, batched)
        long_rope = self.inputs.long_rope_flags(num_tokens)
        if long_rope is not None:
            meta.long_rope = torch.from_numpy(long_rope.astype(bool)).to(self.device)
        for window, group in self._windows:
            meta.windows[window] = self._windowed(*groups[group], ranges, window)
        return meta

    def _windowed(
        self,
        slot_mapping: torch.Tensor,
        key_slots: torch.Tensor,
        batched: DecodeBatch | None,
        ranges: list[tuple[int, int, int, int, int]],
        window: int,
    ) -> AttentionMetadata:
        """The step seen through a sliding `window`, in the blocks of the KV
        group its layers are in (`slot_mapping`, `key_slots` and the decode
        batch `batched` of that group): each sequence keeps the
        keys from the first one its first query sees (`query_pos - key_pos
        < window`, transformers' sliding mask) and masks, per query, those
        before its own window; the decode batch keeps each sequence's last
        `window` keys."""
        sequences = []
        for start, end, key_start, seq_len, context in ranges:
            if batched is not None and end - start == 1:
                continue
            first = max(0, context - window + 1)
            mask = None
            if end - start > 1:
                query_pos = torch.arange(context, seq_len, device=self.device)[:, None]
                key_pos = torch.arange(first, seq_len, device=self.device)[None, :]
                mask = (key_pos <= query_pos) & (query_pos - key_pos < window)
            sequences.append(SequenceSlice(start, end, key_slots[key_start + first : key_start + seq_len], mask))
        decodes = None
        if batched is not None:
            lens = batched.lens.clamp(max=window)
            # Each row's last `lens` keys, shifted to the front; the padding
            # repeats the first of them (a key the sequence wrote).
            offsets = (batched.lens - lens)[:, None]
            columns = torch.arange(int(lens.max()), device=self.device)[None, :]
            index = torch.where(columns < lens[:, None], columns + offsets, offsets)
            slots = batched.key_slots.gather(1, index)
            mask = None if batched.mask is None else (columns < lens[:, None])[:, None, None, :]
            decodes = DecodeBatch(batched.rows, slots.contiguous(), lens, mask)
        return AttentionMetadata(slot_mapping, sequences, decodes)

    def _stage_decodes(
        self, decodes: list[tuple[int, int, int, int, int]], key_slots: np.ndarray, buffer: CpuGpuBuffer
    ) -> DecodeBatch:
        """The one-token sequences of the step as one padded batch, their
        keys from one group's `key_slots` (padded in `buffer`): their rows,
        their key slots `[n, longest]` (padding repeats the sequence's first
        key slot and is masked out, or not read by the kernel) and key
        counts."""
        n = len(decodes)
        longest = max(seq_len for _, _, _, seq_len, _ in decodes)
        padded = buffer.np[: n * longest].reshape(n, longest)
        for i, (start, _, key_start, seq_len, _) in enumerate(decodes):
            self.decode_rows.np[i] = start
            self.decode_lens.np[i] = seq_len
            padded[i, :seq_len] = key_slots[key_start : key_start + seq_len]
            # torch's attention reads the padding's keys and values and gives
            # them zero weight; a slot never written may hold NaN (the cache
            # is not zeroed), and NaN * 0 is NaN: the padding points at a key
            # this sequence wrote.
            padded[i, seq_len:] = padded[i, 0]
        lens = self.decode_lens.copy_to_gpu(n)
        mask = None
        if not self._decodes_in_place:
            mask = (torch.arange(longest, device=self.device)[None, :] < lens[:, None])[:, None, None, :]
        return DecodeBatch(
            self.decode_rows.copy_to_gpu(n), buffer.copy_to_gpu(n * longest).view(n, longest), lens, mask
        )
