"""The configuration an engine core is started with: a picklable stand-in for
vLLM's `VllmConfig`, with the parts the reference engine and usage reporting
read (`model_config`, `cache_config`, `scheduler_config`, `parallel_config`,
`device_config`) plus the addresses of every frontend (client) to serve."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_rs.engine.models import DEFAULT_MAX_MODEL_LEN, ModelSpec, resolve_model

#: Scheduler limits by model type: (max_num_seqs, max_num_batched_tokens).
DEFAULT_LIMITS = {"toy": (64, 2048), "echo": (256, 8192)}
#: KV-cache block size in tokens.
DEFAULT_BLOCK_SIZE = 16


class EngineConfigError(ValueError):
    """An engine setting that cannot work (names the setting)."""


@dataclass
class ModelConfig:
    """What model runs and how long its sequences may be."""

    model: str
    spec: ModelSpec
    max_model_len: int
    dtype: str = "float32"
    seed: int = 0

    @property
    def architectures(self) -> list[str]:
        """vLLM-style architecture names (`ToyForCausalLM`, `EchoModel`)."""
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
    """Where engines reach the data-parallel coordinator (`vllm_rs.coordinator`)."""

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
) -> EngineConfig:
    """An EngineConfig with the model type's defaults filled in. Raises
    `ModelPathError` for a bad model, `EngineConfigError` for bad limits."""
    spec = resolve_model(model)
    default_seqs, default_tokens = DEFAULT_LIMITS[spec.model_type]
    max_len = max_model_len or min(DEFAULT_MAX_MODEL_LEN[spec.model_type], spec.max_position)
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
    ]
    for name, value, ok in checks:
        if not ok:
            limit = f" (the model holds at most {spec.max_position} positions)" if name == "--max-model-len" else ""
            raise EngineConfigError(f"{name}: invalid value {value!r}{limit}")
    return EngineConfig(
        model_config=ModelConfig(model=model, spec=spec, max_model_len=max_len, seed=seed),
        cache_config=CacheConfig(
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
            enable_prefix_caching=spec.model_type == "toy" if enable_prefix_caching is None else enable_prefix_caching,
        ),
        scheduler_config=SchedulerConfig(max_num_seqs or default_seqs, max_num_batched_tokens or default_tokens),
        parallel_config=ParallelConfig(data_parallel_size=data_parallel_size),
        device_config=DeviceConfig(device),
        clients=list(clients or []),
        log_stats=log_stats,
    )
