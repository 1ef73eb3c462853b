"""The configuration an engine core is started with: a picklable stand-in for
vLLM's `VllmConfig`, with the parts the reference engine and usage reporting
read (`model_config`, `cache_config`, `scheduler_config`, `parallel_config`,
`device_config`) plus the addresses of every frontend (client) to serve."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from vllm_rs.engine.cuda_probe import cuda_available
from vllm_rs.engine.kv_cache.kv_cache_manager import blocks_held_at_most
from vllm_rs.engine.model_loader.checkpoint import DTYPE_BYTES
from vllm_rs.engine.model_loader.pooler_config import (
    PoolerConfig,
    PoolerConfigError,
    RunnerChoice,
    default_pooling_type,
    resolve_runner,
    sentence_transformers_max_len,
    sentence_transformers_pooler,
)
from vllm_rs.engine.model_loader.registry import DEFAULT_MAX_MODEL_LEN, ModelSpec, resolve_model

#: Scheduler limits by model type: (max_num_seqs, max_num_batched_tokens);
#: real models get `DEFAULT_REAL_LIMITS`.
DEFAULT_LIMITS = {"toy": (64, 2048), "echo": (256, 8192)}
DEFAULT_REAL_LIMITS = (64, 2048)
#: KV-cache block size in tokens.
DEFAULT_BLOCK_SIZE = 16
#: `--dtype` choices (vLLM's names).
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: What `--dtype auto` means for a real model on the CPU: the faster of
#: float32 and bfloat16 there (measured, docs/real-models.md).
CPU_AUTO_DTYPE = "float32"
#: `--quantization` choices: `gguf` keeps a GGUF's weights as the file
#: stores them (linear layers of every type the Rust kernel reads, legacy
#: and K-quant blocks, IQ4_NL/XS, F16, BF16, multiplied in place from the
#: file; other types dequantized to float32; embeddings read from the file;
#: CPU and float32 activations only), `none` dequantizes them to `--dtype`.
#: Unset: `gguf` for a GGUF with weights the kernel reads, on the CPU in
#: float32; for a float16/bfloat16 safetensors checkpoint there, its linear
#: layers multiplied as stored (resolved as HALF_IN_PLACE); else `none`.
QUANTIZATIONS = ("gguf", "none")
#: The resolved `quantization` of a float16/bfloat16 safetensors checkpoint
#: whose linear layers the Rust kernel multiplies as stored (no float32 copy).
HALF_IN_PLACE = "half"
#: Bytes per weight of a `gguf` model's linear layers, at most: 2 or less
#: for the types the kernel reads (Q8_0: 34 bytes per 32, F16: 2), but
#: float32 for the others (F32, the other i-quants).
PACKED_WEIGHT_BYTES = 4
#: vLLM's KV-cache budget on the CPU, in GiB.
CPU_KVCACHE_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
#: A real model's KV cache on the CPU when no budget is given: at most this
#: (vLLM's `VLLM_CPU_KVCACHE_SPACE` default, 4 GiB) and at most half the
#: memory left after the weights, less when `max_num_seqs` full sequences
#: need less; at least one full sequence.
DEFAULT_CPU_KV_BYTES = 4 << 30


#: `--kv-cache-dtype` values vLLM 0.33 accepts (its `CacheDType`).
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "int8", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
#: The ones this engine runs: `auto` (the model's `--dtype`, exact) and the
#: 16-bit caches (values rounded to 16 bits when written: docs/real-models.md,
#: "KV cache dtype").
SUPPORTED_KV_CACHE_DTYPES = ("auto", "float16", "bfloat16")
#: `--kernel-precision`: the native step's products, exact (the default) or
#: with int8 activations (rust/kernels, `Precision`).
KERNEL_PRECISIONS = ("exact", "int8")


class EngineConfigError(ValueError):
    """An engine setting that cannot work (names the setting)."""


@dataclass
class ModelConfig:
    """What model runs, in which dtype, and how long its sequences may be."""

    model: str
    spec: ModelSpec
    max_model_len: int
    dtype: str = "float32"
    seed: int = 0
    #: How the weights are held: "gguf" (a GGUF's, as stored, see
    #: QUANTIZATIONS), HALF_IN_PLACE (a half-precision safetensors
    #: checkpoint's linear layers, as stored) or None (converted to
    #: `dtype`); vLLM's `quantization` field.
    quantization: str | None = None
    #: Run the model's torch modules operation by operation even where the
    #: native step could run it (`--enforce-eager`, vLLM's name for "no
    #: captured or compiled step").
    enforce_eager: bool = False
    #: The native step's products: "exact" or "int8" (`--kernel-precision`).
    kernel_precision: str = "exact"
    #: What the engine runs the model as (`--runner`, `--convert`, resolved).
    runner: RunnerChoice = field(default_factory=lambda: RunnerChoice("generate"))
    #: A pooling model's pooler, resolved (the pooling type always set).
    pooler: PoolerConfig | None = None

    @property
    def architectures(self) -> list[str]:
        """vLLM-style architecture names (`LlamaForCausalLM`, ...,
        `ToyForCausalLM`, `EchoModel`)."""
        if self.spec.architecture is not None:
            return [self.spec.architecture]
        return ["ToyForCausalLM" if self.spec.model_type == "toy" else "EchoModel"]

    @property
    def architecture(self) -> str:
        """The first architecture name."""
        return self.architectures[0]


@dataclass
class CacheConfig:
    """The KV cache: block size, block count (None: sized from the limits),
    prefix caching."""

    block_size: int = DEFAULT_BLOCK_SIZE
    num_gpu_blocks: int | None = None
    enable_prefix_caching: bool = True
    cache_dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    #: The KV cache's memory budget (`--kv-cache-memory-bytes`), when given.
    kv_cache_memory_bytes: int | None = None


@dataclass
class SchedulerConfig:
    """Continuous-batching limits per step."""

    max_num_seqs: int
    max_num_batched_tokens: int


@dataclass
class ParallelConfig:
    """Data parallelism: one engine process per rank."""

    data_parallel_size: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1


@dataclass
class DeviceConfig:
    """`auto` (CUDA when there is one), `cpu` or `cuda`."""

    device: str = "auto"


@dataclass
class ClientAddresses:
    """One frontend's ZeroMQ endpoints: the engine connects a DEALER to
    `input_address` and a PUSH to `output_address`."""

    input_address: str
    output_address: str


@dataclass
class CoordinatorAddresses:
    """Where engines reach the data-parallel coordinator (`vllm_rs.serving.coordinator`)."""

    #: The engine connects an XSUB here: READY, then START_DP_WAVE messages.
    engine_publish: str
    #: The engine connects a PUSH here: its counts and wave messages.
    engine_output: str
    #: What frontends subscribe to; the engine registers it as `dp_stats_address`.
    front_publish: str


@dataclass
class EngineConfig:
    """Everything an engine core process needs (vLLM's `VllmConfig` role)."""

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
    clients: list[ClientAddresses] = field(default_factory=list)
    log_stats: bool = True
    #: The data-parallel coordinator, when there is one (DP > 1 under `serve`).
    coordinator: CoordinatorAddresses | None = None
    #: When set (a multi-node stack), the engine's sockets send ZMTP
    #: heartbeats every second announcing this TTL, so a libzmq frontend
    #: drops the connection of an engine that went silent.
    heartbeat_ttl_s: float | None = None


def make_engine_config(
    model: str,
    *,
    clients: list[ClientAddresses] | None = None,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    num_gpu_blocks: int | None = None,
    enable_prefix_caching: bool | None = None,
    data_parallel_size: int = 1,
    device: str = "auto",
    seed: int = 0,
    log_stats: bool = True,
    dtype: str = "auto",
    kv_cache_memory_bytes: int | None = None,
    tokenizer_dir: str | None = None,
    quantization: str | None = None,
    enforce_eager: bool = False,
    kernel_precision: str = "exact",
    kv_cache_dtype: str = "auto",
    runner: str = "auto",
    convert: str = "auto",
    pooler_config: PoolerConfig | None = None,
) -> EngineConfig:
    """An EngineConfig with the model type's defaults filled in and the KV
    cache sized (`num_gpu_blocks`; for a real model from
    `kv_cache_memory_bytes`, else `VLLM_CPU_KVCACHE_SPACE` on the CPU).
    `tokenizer_dir` (a directory with `tokenizer.json`) overrides the
    model's own. `runner`, `convert` and `pooler_config` are vLLM's
    `--runner`, `--convert` and `--pooler-config` (a pooling model keeps no
    KV cache and computes each input whole in one step). Raises
    `ModelPathError` for a bad model, `EngineConfigError` for bad limits or
    a cache that does not fit."""
    spec = resolve_model(model)
    if tokenizer_dir is not None:
        spec.tokenizer_dir = tokenizer_dir
    choice, pooler = _pooling_choice(spec, runner, convert, pooler_config)
    default_seqs, default_tokens = DEFAULT_LIMITS.get(spec.model_type, DEFAULT_REAL_LIMITS)
    real = spec.is_real or spec.is_encoder
    default_len = spec.max_position if real else DEFAULT_MAX_MODEL_LEN[spec.model_type]
    if spec.is_encoder and sentence_transformers_max_len(spec.source):
        default_len = min(default_len, sentence_transformers_max_len(spec.source))
    max_len = max_model_len or min(default_len, spec.max_position)
    if choice.is_pooling:
        # Each input is computed whole in one step: the step holds the longest.
        default_tokens = max(default_tokens, max_len)
    checks: list[tuple[str, Any, bool]] = [
        ("--max-model-len", max_len, 1 <= max_len <= spec.max_position),
        ("--max-num-seqs", max_num_seqs, max_num_seqs is None or max_num_seqs >= 1),
        (
            "--max-num-batched-tokens",
            max_num_batched_tokens,
            max_num_batched_tokens is None or max_num_batched_tokens >= 1,
        ),
        ("--block-size", block_size, block_size >= 1),
        ("--num-gpu-blocks", num_gpu_blocks, num_gpu_blocks is None or num_gpu_blocks >= 1),
        ("--data-parallel-size", data_parallel_size, 1 <= data_parallel_size <= 65536),
        ("--device", device, device in ("auto", "cpu", "cuda")),
        ("--dtype", dtype, dtype in DTYPES),
        ("--quantization", quantization, quantization is None or quantization in QUANTIZATIONS),
        ("--kv-cache-dtype", kv_cache_dtype, kv_cache_dtype in KV_CACHE_DTYPES),
        ("--kernel-precision", kernel_precision, kernel_precision in KERNEL_PRECISIONS),
        (
            "--kv-cache-memory-bytes",
            kv_cache_memory_bytes,
            kv_cache_memory_bytes is None or kv_cache_memory_bytes >= 1,
        ),
    ]
    for name, value, ok in checks:
        if not ok:
            limit = f" (the model holds at most {spec.max_position} positions)" if name == "--max-model-len" else ""
            raise EngineConfigError(f"{name}: invalid value {value!r}{limit}")
    if choice.is_pooling and max_num_batched_tokens is not None and max_num_batched_tokens < max_len:
        raise EngineConfigError(
            f"--max-num-batched-tokens {max_num_batched_tokens}: a pooling model computes each input whole, "
            f"so it must be at least --max-model-len {max_len}"
        )
    if real and device == "auto":
        device = "cuda" if cuda_available() else "cpu"
    resolved_dtype = resolve_dtype(dtype, spec, device)
    resolved_quantization = resolve_quantization(quantization, spec, device, resolved_dtype)
    if kernel_precision == "int8":
        # int8 products exist only in the native step: refuse where it cannot run.
        why_not = (
            "--enforce-eager" if enforce_eager else "a pooling model" if choice.is_pooling
            else f"the {spec.model_type} model" if not real else f"on {device}" if device != "cpu" else None
        )  # fmt: skip
        if why_not is not None:
            raise EngineConfigError(f"--kernel-precision int8 needs the native step, which does not run {why_not}")
    if kv_cache_dtype not in SUPPORTED_KV_CACHE_DTYPES:
        raise EngineConfigError(
            f"--kv-cache-dtype {kv_cache_dtype}: not supported by this engine "
            f"(it runs {', '.join(SUPPORTED_KV_CACHE_DTYPES)})"
        )
    scheduler = SchedulerConfig(max_num_seqs or default_seqs, max_num_batched_tokens or default_tokens)
    cache = CacheConfig(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        enable_prefix_caching=spec.model_type != "echo" if enable_prefix_caching is None else enable_prefix_caching,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        cache_dtype=kv_cache_dtype,
    )
    if choice.is_pooling:
        cache.enable_prefix_caching = False  # no KV cache to share
    elif spec.model_type != "echo":
        cache.num_gpu_blocks = size_kv_cache(
            spec, cache, scheduler, max_len, resolved_dtype, device, data_parallel_size, resolved_quantization
        )
    return EngineConfig(
        model_config=ModelConfig(
            model=model,
            spec=spec,
            max_model_len=max_len,
            dtype=resolved_dtype,
            seed=seed,
            quantization=resolved_quantization,
            enforce_eager=enforce_eager,
            kernel_precision=kernel_precision,
            runner=choice,
            pooler=pooler,
        ),
        cache_config=cache,
        scheduler_config=scheduler,
        parallel_config=ParallelConfig(data_parallel_size=data_parallel_size),
        device_config=DeviceConfig(device),
        clients=list(clients or []),
        log_stats=log_stats,
    )


def _pooling_choice(
    spec: ModelSpec, runner: str, convert: str, pooler_config: PoolerConfig | None
) -> tuple[RunnerChoice, PoolerConfig | None]:
    """The runner for `spec` and, when it pools, its pooler: `--pooler-config`
    over the sentence-transformers folder's, over the architecture's default."""
    if spec.architecture is None:
        if runner == "pooling" or convert in ("embed", "classify"):
            raise EngineConfigError(f"--runner pooling: the {spec.model_type} model cannot pool")
        return RunnerChoice("generate"), None
    try:
        choice = resolve_runner(runner, convert, spec.architecture)
    except PoolerConfigError as e:
        raise EngineConfigError(str(e)) from None
    if not choice.is_pooling:
        return choice, None
    if spec.is_gguf or (spec.transformer is not None and spec.transformer.model_type == "gemma3_text"):
        raise EngineConfigError(f"--runner pooling: {spec.architecture} from this checkpoint cannot pool")
    if spec.transformer is not None and choice.task == "classify":
        raise EngineConfigError(f"--convert classify: {spec.architecture} has no classification head here")
    own = sentence_transformers_pooler(spec.source) or PoolerConfig()
    pooler = (pooler_config or PoolerConfig()).over(own.over(PoolerConfig(default_pooling_type(spec.architecture))))
    return choice, pooler


def resolve_dtype(dtype: str, spec: ModelSpec, device: str) -> str:
    """`--dtype auto` made concrete: float32 for the toy model; for a real
    model the checkpoint's half dtype on CUDA (bfloat16 for a float32 one),
    `CPU_AUTO_DTYPE` on the CPU."""
    if dtype != "auto":
        return dtype
    if not spec.is_real:
        return "float32"
    if device == "cuda":
        saved = spec.transformer.checkpoint_dtype
        return saved if saved in ("bfloat16", "float16") else "bfloat16"
    return CPU_AUTO_DTYPE


def resolve_quantization(quantization: str | None, spec: ModelSpec, device: str, dtype: str) -> str | None:
    """`--quantization` made concrete: "gguf", HALF_IN_PLACE or None
    (converted to `dtype`). Unset, on the CPU in float32: "gguf" for a GGUF
    with weights the kernel reads in place (Q8_0, Q4_K, F16, ...),
    HALF_IN_PLACE for a float16/bfloat16 safetensors checkpoint; exact
    either way. Raises EngineConfigError when "gguf" is asked for where it
    cannot run (not a GGUF, not the CPU, not float32)."""
    if quantization is None:
        if not spec.is_real or device != "cpu" or dtype != "float32":
            return None
        if spec.is_gguf:
            return "gguf" if spec.gguf_in_place else None
        return HALF_IN_PLACE if spec.transformer.checkpoint_dtype in ("float16", "bfloat16") else None
    if quantization == "none":
        return None
    if not spec.is_gguf:
        raise EngineConfigError("--quantization gguf: the model is not a .gguf file (use --quantization none)")
    if device != "cpu":
        raise EngineConfigError(f"--quantization gguf: runs on the CPU only, not --device {device}")
    if dtype != "float32":
        raise EngineConfigError(f"--quantization gguf: needs --dtype float32 activations, not --dtype {dtype}")
    return quantization


def weight_bytes(spec: ModelSpec, dtype: str, quantization: str | None) -> int:
    """Bytes a real model's weights take in memory (the memory check)."""
    per_weight = {"gguf": PACKED_WEIGHT_BYTES, HALF_IN_PLACE: 2}.get(quantization, DTYPE_BYTES[dtype])
    return spec.transformer.num_parameters() * per_weight


def kv_cache_dtype(cache: CacheConfig, dtype: str) -> str:
    """The dtype the KV cache holds: the model's `dtype` for `auto`, else
    `--kv-cache-dtype`'s."""
    return dtype if cache.cache_dtype == "auto" else cache.cache_dtype


def kv_bytes_per_token(spec: ModelSpec, dtype: str) -> int:
    """KV-cache bytes one token takes over all layers."""
    if spec.transformer is not None:
        return spec.transformer.kv_bytes_per_token(dtype)
    return 2 * int(spec.hparams["num_layers"]) * int(spec.hparams["hidden_size"]) * DTYPE_BYTES[dtype]


def available_memory_bytes() -> int:
    """The host memory available now (Linux `MemAvailable`, else all of it)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def size_kv_cache(
    spec: ModelSpec,
    cache: CacheConfig,
    scheduler: SchedulerConfig,
    max_model_len: int,
    dtype: str,
    device: str,
    engines: int,
    quantization: str | None = None,
) -> int | None:
    """KV blocks per engine: `--num-gpu-blocks` when given, else what the
    budget holds (`--kv-cache-memory-bytes`, else `VLLM_CPU_KVCACHE_SPACE`
    GiB on the CPU), else enough for `max_num_seqs` full sequences (a real
    model on the CPU: at most `DEFAULT_CPU_KV_BYTES`; on CUDA: None, the
    runner sizes it from free device memory). A full sequence is what one
    holds at most: with a sliding window on every layer, its window and one
    step (`blocks_held_at_most`). Raises EngineConfigError when the budget
    holds no full sequence, or when on the CPU the weights and the cache of
    every engine exceed the memory available."""
    block_bytes = kv_bytes_per_token(spec, kv_cache_dtype(cache, dtype)) * cache.block_size
    # A sliding window on every layer bounds what one sequence holds at once.
    min_blocks = blocks_held_at_most(max_model_len, cache.block_size, spec.kv_window, scheduler.max_num_batched_tokens)
    wanted = min_blocks * scheduler.max_num_seqs
    budget, source = cache.kv_cache_memory_bytes, "--kv-cache-memory-bytes"
    if budget is None and device == "cpu" and os.environ.get(CPU_KVCACHE_SPACE_ENV):
        source = f"{CPU_KVCACHE_SPACE_ENV}={os.environ[CPU_KVCACHE_SPACE_ENV]}"
        try:
            budget = int(float(os.environ[CPU_KVCACHE_SPACE_ENV]) * (1 << 30))
        except ValueError:
            raise EngineConfigError(f"{source}: not a number of GiB") from None
    if cache.num_gpu_blocks is not None:
        blocks = cache.num_gpu_blocks
    elif budget is not None:
        blocks = budget // block_bytes
        if blocks < min_blocks:
            raise EngineConfigError(
                f"{source}: a KV cache of {budget} bytes holds {blocks * cache.block_size} tokens, "
                f"but one sequence of --max-model-len {max_model_len} needs {min_blocks * block_bytes} bytes "
                f"({block_bytes} per block of {cache.block_size} tokens): raise the budget or lower --max-model-len"
            )
    elif not spec.is_real:
        blocks = wanted
    elif device == "cpu":
        weights = weight_bytes(spec, dtype, quantization)
        spare = max(0, available_memory_bytes() // engines - weights) // 2
        blocks = max(min_blocks, min(wanted, min(DEFAULT_CPU_KV_BYTES, spare) // block_bytes))
    else:
        return None
    if spec.is_real and device == "cpu":
        weights = weight_bytes(spec, dtype, quantization)
        needed = engines * (weights + blocks * block_bytes)
        available = available_memory_bytes()
        if needed > available:
            raise EngineConfigError(
                f"the model's weights ({_gib(weights)} in {dtype}) and its KV cache ({_gib(blocks * block_bytes)}, "
                f"{blocks} blocks) need {_gib(needed)} for {engines} engine(s), but {_gib(available)} of memory is "
                f"available: lower --kv-cache-memory-bytes ({CPU_KVCACHE_SPACE_ENV}) or --max-model-len, "
                "or choose a smaller --dtype"
            )
    return blocks
