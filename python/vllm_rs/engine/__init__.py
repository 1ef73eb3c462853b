"""The reference engine core: a Python process that speaks the engine-core
protocol (docs/engine-protocol.md) behind either frontend.

`run_engine_core` is the target `CoreEngineProcManager` starts;
`make_engine_config` builds its configuration. Models: `toy` (a tiny torch
decoder) and `echo` (no model; torch is never imported for it). Importing
this package loads neither the engine core nor numpy or torch: `serve`'s
supervisor imports it to configure and start engines, and stays light.
"""

from typing import Any

from vllm_rs.engine.config import ClientAddresses, EngineConfig, EngineConfigError, make_engine_config
from vllm_rs.engine.model_loader.registry import ModelPathError, resolve_model

__all__ = [
    "ClientAddresses",
    "EngineConfig",
    "EngineConfigError",
    "ModelPathError",
    "make_engine_config",
    "resolve_model",
    "run_engine_core",
]


def run_engine_core(*args: Any, **kwargs: Any) -> None:
    """`vllm_rs.engine.core_proc.run_engine_core` (same arguments), imported
    when called: a process that only starts engines pickles this function by
    name and never imports the engine core (numpy, and torch for a model)."""
    from vllm_rs.engine.core_proc import run_engine_core as run

    run(*args, **kwargs)
