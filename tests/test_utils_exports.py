"""`vllm_rs.utils` is a drop-in for `vllm.v1.utils`: every contract name is
importable, and importing it stays light (torch loads on first use)."""

import subprocess
import sys

import vllm_rs.utils as utils

CONTRACT_NAMES = [
    "ConstantList", "kill_process_tree", "shutdown", "wait_for_completion_or_failure",
    "CoreEngineProcManager", "APIServerProcessManager", "RustFrontendProcessManager",
    "get_engine_client_zmq_addr", "run_api_server_worker_proc", "CpuGpuBuffer", "copy_slice",
    "tensor_data", "bind_kv_cache", "IterationDetails", "compute_iteration_details",
    "record_function_or_nullcontext", "report_usage_stats", "UsageContext", "is_usage_stats_enabled",
]  # fmt: skip


def test_every_contract_name_is_exported():
    for name in CONTRACT_NAMES:
        assert name in utils.__all__
        assert getattr(utils, name) is not None
    from vllm_rs.tensor_utils import CpuGpuBuffer

    assert utils.CpuGpuBuffer is CpuGpuBuffer


def test_importing_utils_does_not_import_torch():
    code = "import sys, vllm_rs.utils; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
