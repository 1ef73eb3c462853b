"""What an engine core's executor holds of a GGUF's linear weights, read
the same way for the torch-free native executor and the torch one."""

from __future__ import annotations

from vllm_rs.engine.core import EngineCore
from vllm_rs.engine.layers.gguf_blocks import GgufBlocks
from vllm_rs.engine.worker.native_executor import NativeExecutor
from vllm_rs.engine.worker.native_step import head_name, linear_names


def linear_blocks(core: EngineCore) -> dict[str, GgufBlocks | None]:
    """Each linear weight of the core's model by Hugging Face name (the
    output head as `lm_head.weight`, tied or not): the blocks the kernel
    reads it from, None where it is held dense."""
    executor = core.runner.executor
    if isinstance(executor, NativeExecutor):
        config = core.config.model_config.spec.transformer
        head = head_name(config)
        return {("lm_head.weight" if n == head else n): executor.weights[n] for n in linear_names(config)}
    from vllm_rs.engine.layers.packed_weights import PackedLinear

    modules = executor.model.named_modules()
    return {f"{name}.weight": m.blocks for name, m in modules if isinstance(m, PackedLinear)}
