"""The engine's CPU threads: the Rust kernels split each call across
workers that stay up between calls (also in a forked child), a model whose
every matmul is a kernel call leaves torch's own operators on one thread
while the kernels keep the engine's share, and the kernels' thread count
does not change the packaged SmolLM2's greedy tokens."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from vllm_rs import _core
from vllm_rs.engine import cpu_threads, make_engine_config
from vllm_rs.engine.core import EngineCore
from vllm_rs.engine.protocol import EngineCoreRequest

#: Q8_0 blocks of 32 weights: a float16 scale, then 32 int8.
Q8_0 = 8


def run_child(code: str, env: dict[str, str] | None = None) -> str:
    """Runs `code` in a fresh interpreter (thread settings are per process);
    its stdout. A hang fails the test instead of stalling the suite."""
    ran = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, **(env or {})})  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    return ran.stdout


def test_a_forked_child_runs_the_kernels_on_threads_of_its_own():
    # The parent's workers are not in a forked child: it must start its own,
    # not wait for threads that do not exist there.
    out = run_child("""
        import os
        import numpy as np
        from vllm_rs import _core
        rng = np.random.default_rng(0)
        n, k, m = 256, 64, 16
        scales = np.full((n, k // 32, 1), 0.01, np.float16).view(np.uint8)
        w = np.concatenate([scales, rng.integers(0, 256, (n, k // 32, 32), dtype=np.uint8)], axis=2).reshape(n, -1)
        x = rng.standard_normal((m, k), dtype=np.float32)
        parent = np.empty((m, n), np.float32)
        _core.gguf_matmul(x, w, parent, 8, n, k, 2)
        pid = os.fork()
        if pid == 0:
            child = np.empty((m, n), np.float32)
            _core.gguf_matmul(x, w, child, 8, n, k, 2)
            os._exit(0 if np.array_equal(child, parent) else 1)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    assert out.strip() == "0"


def test_a_kernel_only_model_leaves_torch_on_one_thread(smollm2):
    out = run_child(f"""
        import torch
        from vllm_rs.engine import cpu_threads, make_engine_config
        from vllm_rs.engine.core import EngineCore
        for quantization in ("gguf", "none"):
            # The torch executor (--enforce-eager): the native one runs no torch at all.
            config = make_engine_config({smollm2!r}, device="cpu", max_model_len=128, enforce_eager=True,
                                        kv_cache_memory_bytes=16 << 20, quantization=quantization)
            EngineCore(config)
            print(quantization, torch.get_num_threads(), cpu_threads.kernel_threads())
    """, env={"OMP_NUM_THREADS": "3"})  # fmt: skip
    # gguf: every matmul is the kernel's; none: torch's float32 matmuls need its threads.
    printed = [line for line in out.splitlines() if line.startswith(("gguf ", "none "))]
    assert printed == ["gguf 1 3", "none 3 3"], out


def test_the_kernels_threads_leave_greedy_tokens_alone(smollm2):
    config = make_engine_config(smollm2, device="cpu", dtype="float32", max_model_len=256,
                                kv_cache_memory_bytes=32 << 20)  # fmt: skip
    core = EngineCore(config)
    prompts = [[504, 3575, 282, 4649, 314], list(range(1000, 1040)), [1, 9690, 198]]

    def greedy(threads: int) -> list[list[int]]:
        cpu_threads.set_kernel_threads(threads)
        for i, prompt in enumerate(prompts):
            params = {"temperature": 0.0, "max_tokens": 16, "ignore_eos": True}
            core.add_request(EngineCoreRequest(f"t{threads}-{i}", prompt, params))
        tokens: dict[str, list[int]] = {}
        while core.has_work():
            for _, output in core.step():
                tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
        return [tokens[f"t{threads}-{i}"] for i in range(len(prompts))]

    try:
        one, three = greedy(1), greedy(3)
    finally:
        cpu_threads.set_kernel_threads(torch.get_num_threads())
    assert one == three
    assert all(len(tokens) == 16 for tokens in one)


def test_kernel_threads_below_one_are_refused():
    with pytest.raises(ValueError, match="at least 1, got 0"):
        cpu_threads.set_kernel_threads(0)
    x, out = np.zeros((1, 32), np.float32), np.zeros((1, 1), np.float32)
    with pytest.raises(ValueError, match="threads must be at least 1"):
        _core.gguf_matmul(x, np.zeros((1, 34), np.uint8), out, Q8_0, 1, 32, 0)
