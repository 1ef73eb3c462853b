"""The Python API server: the same OpenAI HTTP surface as the Rust frontend
(routes, errors, streaming, auth, metric names), on FastAPI, uvicorn and
uvloop, talking to engine cores over the engine-core protocol.

`run_server_worker` is what `vllm_rs.process_setup.run_api_server_worker_proc` calls
in each API server process.
"""

from vllm_rs.api_server.server import run_server_worker

__all__ = ["run_server_worker"]
