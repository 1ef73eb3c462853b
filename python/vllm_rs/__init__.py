"""vllm-rs: vLLM's process and runtime layer on a Rust core.

Public entry points: `vllm_rs.utils` (a drop-in for `vllm.v1.utils`) and
`vllm_rs.network_utils`. Importing this package is cheap: nothing heavy
(torch, zmq) loads until a submodule that needs it is imported.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # `vllm_rs.frontend_binary`, imported on first use to keep `import vllm_rs` cheap.
    if name == "frontend_binary":
        from vllm_rs.serving.frontend_binary import frontend_binary

        return frontend_binary
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
