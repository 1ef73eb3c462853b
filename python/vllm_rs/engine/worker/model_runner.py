"""Runs a model (the toy model or a real one, `llama.CausalLM`) for one
engine: allocates the KV cache per layer and binds it with `bind_kv_cache`,
stages each step's inputs (token ids, positions, cache slots) in
`CpuGpuBuffer`s, runs one forward pass over every scheduled request (prefill
chunks and decodes together) and samples. CUDA when there is one (or
`--device cuda`), else the CPU; the same code on both.

What it keeps of each request (the prompt positions scored, the seeded
generator) is its own (`request_state.CachedRequestState`), dropped when a
step's plan says the request finished; the scheduler's requests are only read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_rs.engine.config import EngineConfig, EngineConfigError, kv_bytes_per_token, kv_cache_dtype
from vllm_rs.engine.cpu_threads import keep_torch_on_one_thread, kernel_threads, limit_cpu_threads
from vllm_rs.engine.kv_cache.prefix_hash import hash_block_tokens
from vllm_rs.engine.layers.attention import AttentionMetadata, DecodeBatch, SequenceSlice, attends_in_place
from vllm_rs.engine.layers.packed_weights import every_matmul_in_kernels
from vllm_rs.engine.models.toy_model import ToyConfig, ToyDecoder
from vllm_rs.engine.sample.logprobs import gather, num_columns
from vllm_rs.engine.sample.sampler import Sampler
from vllm_rs.engine.sched.output import ModelOutput, StepPlan
from vllm_rs.engine.sched.request import Request
from vllm_rs.engine.worker.native_step import NativeStep, native_step_unsupported
from vllm_rs.engine.worker.request_state import CachedRequestState
from vllm_rs.logger import init_logger
from vllm_rs.tensor_utils import CpuGpuBuffer, bind_kv_cache, compute_iteration_details

logger = init_logger(__name__)


def resolve_device(name: str) -> torch.device:
    """`auto` -> CUDA when available, else CPU; `cuda` without CUDA raises
    RuntimeError."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: CUDA is not available")
    return torch.device(name)


@dataclass
class StagedStep:
    """A step staged in the host buffers: each request's `(first row, end
    row, first key, keys, first position)`, the requests sampled, the
    prompt positions scored and the key slots staged (`num_keys`)."""

    ranges: list[tuple[int, int, int, int, int]]
    sample_requests: list[CachedRequestState]
    prompt_scores: list[tuple[CachedRequestState, list[int]]]
    num_keys: int


class KVCacheTooSmallError(RuntimeError):
    """The device's free memory holds no full sequence's KV cache."""


#: Fraction of a CUDA device's free memory (after the weights) the KV cache
#: takes when no budget is given (vLLM's `gpu_memory_utilization` default).
CUDA_KV_FRACTION = 0.9


class ModelRunner:
    """A model (toy or real) with its KV cache and input buffers."""

    def __init__(self, config: EngineConfig):
        self.device = resolve_device(config.device_config.device)
        if self.device.type == "cpu":
            limit_cpu_threads(config)
        # Structured outputs mask the logits before sampling; their grammars
        # are compiled for the model's tokenizer (a real model needs one) or
        # the toy model's byte vocabulary.
        spec = config.model_config.spec
        self.follows_grammars = not spec.is_real or spec.tokenizer_dir is not None
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
        max_tokens = config.scheduler_config.max_num_batched_tokens
        max_keys = config.scheduler_config.max_num_seqs * config.model_config.max_model_len
        self.input_ids = CpuGpuBuffer(max_tokens, dtype=torch.int64, device=self.device)
        self.positions = CpuGpuBuffer(max_tokens, dtype=torch.int64, device=self.device)
        self.slot_mapping = CpuGpuBuffer(max_tokens, dtype=torch.int64, device=self.device)
        self.key_slots = CpuGpuBuffer(max_keys, dtype=torch.int64, device=self.device)
        self.key_starts = CpuGpuBuffer(max_tokens, dtype=torch.int64, device=self.device)
        max_seqs = config.scheduler_config.max_num_seqs
        self.decode_rows = CpuGpuBuffer(max_seqs, dtype=torch.int64, device=self.device)
        self.decode_lens = CpuGpuBuffer(max_seqs, dtype=torch.int64, device=self.device)
        self.decode_key_slots = CpuGpuBuffer(max_keys, dtype=torch.int64, device=self.device)
        # One row per sampled request, plus every prompt position when prompt logprobs are asked for.
        self.logits_indices = CpuGpuBuffer(
            config.scheduler_config.max_num_seqs + max_tokens, dtype=torch.int64, device=self.device
        )
        self._block_offsets = np.arange(self.block_size, dtype=np.int64)
        # The Rust decode kernel attends in place, also for one sequence;
        # torch's attention is batched only when there are several.
        self._decodes_in_place = attends_in_place(self.device, self.kv_dtype)
        # The sliding windows of the model's layers: each step is also staged
        # as seen through each of them (`AttentionMetadata.windows`).
        layers = self.model.attention_layers().values()
        self._windows = sorted({layer.sliding_window for layer in layers if layer.sliding_window is not None})
        self.sampler = Sampler(self.device)
        #: The runner's state of each request it has seen and not yet seen finish.
        self.requests: dict[str, CachedRequestState] = {}
        self.native_step: NativeStep | None = None
        why_not = "--enforce-eager" if config.model_config.enforce_eager else None
        why_not = why_not or native_step_unsupported(self.model, self.device, self.dtype)
        if why_not is None:
            self.native_step = NativeStep(self.model, config.model_config.kernel_precision)
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
        per_sequence = -(-config.model_config.max_model_len // self.block_size)
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

    def block_hasher(self):
        """The prefix-cache hash function."""
        return hash_block_tokens

    def iteration_details(self, plan: StepPlan):
        """Context/generation requests and tokens of the step."""
        return compute_iteration_details(plan)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> ModelOutput:
        """Runs one step; samples a token for each request that reached the
        end of its known tokens, with the logprobs requests asked for (raw:
        the model's distribution before temperature and the other sampling
        settings, vLLM's default `logprobs_mode`). First forgets the requests
        the plan says finished."""
        for request_id in plan.finished_req_ids:
            self.requests.pop(request_id, None)
        num_tokens = plan.total_num_scheduled_tokens
        if num_tokens == 0:
            return ModelOutput()
        staged = self._stage_inputs(plan, num_tokens)
        sample_requests, prompt_scores = staged.sample_requests, staged.prompt_scores
        num_rows = len(sample_requests) + sum(len(targets) for _, targets in prompt_scores)
        if self.native_step is not None:
            logits = self.native_step.forward(
                self.input_ids.cpu[:num_tokens], self.positions.np[:num_tokens], self.slot_mapping.np[:num_tokens],
                self.key_starts.np[:num_tokens], self.key_slots.np[: staged.num_keys],
                self.logits_indices.np[:num_rows],
            )  # fmt: skip
        else:
            logits = self.model(
                self.input_ids.copy_to_gpu(num_tokens),
                self.positions.copy_to_gpu(num_tokens),
                self._attention_metadata(staged, num_tokens),
                self.logits_indices.copy_to_gpu(num_rows),
            )
        vocab = logits.shape[-1]
        sample_logits = logits[: len(sample_requests)]
        for i, state in enumerate(sample_requests):
            grammar = state.request.grammar
            if grammar is not None:
                # Masked before logprobs too: vLLM applies the grammar bitmask to the logits first.
                banned = torch.from_numpy(~grammar.allowed(vocab)).to(sample_logits.device)
                sample_logits[i].masked_fill_(banned, float("-inf"))
        wanted = [i for i, r in enumerate(sample_requests) if r.sampling.logprobs is not None]
        raw = torch.log_softmax(sample_logits[wanted].float(), dim=-1) if wanted else None
        tokens = self.sampler.sample(sample_logits, sample_requests)
        out = ModelOutput({r.request_id: t for r, t in zip(sample_requests, tokens, strict=True)})
        for row, i in enumerate(wanted):
            state = sample_requests[i]
            k = num_columns(state.sampling.logprobs, vocab)
            out.logprobs[state.request_id] = gather(raw[row : row + 1], [tokens[i]], k)
        offset = len(sample_requests)
        for state, targets in prompt_scores:
            rows = torch.log_softmax(logits[offset : offset + len(targets)].float(), dim=-1)
            offset += len(targets)
            k = num_columns(state.sampling.prompt_logprobs, vocab)
            out.prompt_logprobs[state.request_id] = gather(rows, targets, k)
        return out

    def _stage_inputs(self, plan: StepPlan, num_tokens: int) -> StagedStep:
        """Fills the host buffers of the step's tokens: ids, positions,
        cache slots, each token's sequence's first key (`key_starts`), the
        key slots of every sequence from position 0 (`key_slots`) and the
        rows whose logits are wanted (`logits_indices`)."""
        ids, positions, slots = self.input_ids.np, self.positions.np, self.slot_mapping.np
        key_slots, key_starts = self.key_slots.np, self.key_starts.np
        ranges = []
        sample_requests = []
        # (request, prompt tokens scored): the logits rows of prompt positions
        # go after the sampled rows, so sampling sees a contiguous block.
        prompt_scores: list[tuple[CachedRequestState, list[int]]] = []
        prompt_rows: list[np.ndarray] = []
        row = key_row = 0
        for request in plan.requests:
            state = self._state(request)
            n = plan.num_scheduled_tokens[request.request_id]
            start_pos = request.num_computed_tokens
            end_pos = start_pos + n
            ids[row : row + n] = request.tokens(start_pos, end_pos)
            positions[row : row + n] = np.arange(start_pos, end_pos)
            blocks = np.asarray(request.block_ids[: -(-end_pos // self.block_size)], dtype=np.int64)
            all_slots = (blocks[:, None] * self.block_size + self._block_offsets).reshape(-1)[:end_pos]
            slots[row : row + n] = all_slots[start_pos:end_pos]
            key_slots[key_row : key_row + end_pos] = all_slots
            key_starts[row : row + n] = key_row
            ranges.append((row, row + n, key_row, end_pos, start_pos))
            if end_pos == request.num_tokens:
                self.logits_indices.np[len(sample_requests)] = row + n - 1
                sample_requests.append(state)
            first = max(start_pos, state.num_prompt_scored)
            last = min(end_pos, request.num_prompt_tokens - 1)
            if request.sampling.prompt_logprobs is not None and first < last:
                # Position p scores prompt token p + 1.
                prompt_scores.append((state, request.prompt_token_ids[first + 1 : last + 1]))
                prompt_rows.append(np.arange(row + first - start_pos, row + last - start_pos))
                state.num_prompt_scored = last
            row += n
            key_row += end_pos
        if prompt_rows:
            extra = np.concatenate(prompt_rows)
            self.logits_indices.np[len(sample_requests) : len(sample_requests) + len(extra)] = extra
        return StagedStep(ranges, sample_requests, prompt_scores, key_row)

    def _state(self, request: Request) -> CachedRequestState:
        """The runner's state of `request`, made when it first appears."""
        state = self.requests.get(request.request_id)
        if state is None:
            generator = self.sampler.seeded_generator(request.sampling)
            state = self.requests[request.request_id] = CachedRequestState(request.request_id, request, generator)
        return state

    def _attention_metadata(self, staged: StagedStep, num_tokens: int) -> AttentionMetadata:
        """The torch path's view of a staged step: each sequence's keys and
        causal mask, the decodes batched, and each sliding window's view."""
        ranges, key_row = staged.ranges, staged.num_keys
        decodes = [r for r in ranges if r[1] - r[0] == 1]
        batched = self._stage_decodes(decodes) if len(decodes) > 1 or (decodes and self._decodes_in_place) else None
        key_slots_gpu = self.key_slots.copy_to_gpu(key_row)
        sequences = []
        for start, end, key_start, seq_len, context in ranges:
            if batched is not None and end - start == 1:
                continue
            mask = None
            if end - start > 1:
                query_pos = torch.arange(context, seq_len, device=self.device)
                mask = torch.arange(seq_len, device=self.device)[None, :] <= query_pos[:, None]
            sequences.append(SequenceSlice(start, end, key_slots_gpu[key_start : key_start + seq_len], mask))
        meta = AttentionMetadata(self.slot_mapping.copy_to_gpu(num_tokens), sequences, batched)
        for window in self._windows:
            meta.windows[window] = self._windowed(meta, ranges, key_slots_gpu, batched, window)
        return meta

    def _windowed(
        self,
        meta: AttentionMetadata,
        ranges: list[tuple[int, int, int, int, int]],
        key_slots: torch.Tensor,
        batched: DecodeBatch | None,
        window: int,
    ) -> AttentionMetadata:
        """The step seen through a sliding `window`: each sequence keeps the
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
        return AttentionMetadata(meta.slot_mapping, sequences, decodes)

    def _stage_decodes(self, decodes: list[tuple[int, int, int, int, int]]) -> DecodeBatch:
        """The one-token sequences of the step as one padded batch: their
        rows, their key slots `[n, longest]` (padding repeats the sequence's
        first key slot and is masked out, or not read by the kernel) and key
        counts."""
        n = len(decodes)
        longest = max(seq_len for _, _, _, seq_len, _ in decodes)
        padded = self.decode_key_slots.np[: n * longest].reshape(n, longest)
        for i, (start, _, key_start, seq_len, _) in enumerate(decodes):
            self.decode_rows.np[i] = start
            self.decode_lens.np[i] = seq_len
            padded[i, :seq_len] = self.key_slots.np[key_start : key_start + seq_len]
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
            self.decode_rows.copy_to_gpu(n), self.decode_key_slots.copy_to_gpu(n * longest).view(n, longest), lens, mask
        )
