"""The reference engine core: a Python process that speaks the engine-core
protocol (docs/engine-protocol.md) behind either frontend.

`run_engine_core` is the target `CoreEngineProcManager` starts;
`make_engine_config` builds its configuration. Models: `toy` (a tiny torch
decoder) and `echo` (no model; torch is never imported for it).
"""

from vllm_rs.engine.config import ClientAddresses, EngineConfig, EngineConfigError, make_engine_config
from vllm_rs.engine.core_proc import run_engine_core
from vllm_rs.engine.models import ModelPathError, resolve_model

__all__ = [
    "ClientAddresses",
    "EngineConfig",
    "EngineConfigError",
    "ModelPathError",
    "make_engine_config",
    "resolve_model",
    "run_engine_core",
]
