"""Tests for vllm_rs.tensor_utils: real tensors, real addresses."""

from __future__ import annotations

import logging
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from vllm_rs import tensor_utils as tu  # noqa: E402
from vllm_rs.engine.layers.attention import AttentionMetadata, PagedAttention, SequenceSlice  # noqa: E402
from vllm_rs.tensor_utils import (  # noqa: E402
    PIN_MEMORY,
    CachedRequestData,
    CpuGpuBuffer,
    EncoderInputStats,
    IterationDetails,
    NewRequestData,
    SchedulerOutput,
    bind_kv_cache,
    compute_iteration_details,
    copy_slice,
    extract_layer_index,
    record_function_or_nullcontext,
    tensor_data,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")


def _addr(mv: memoryview) -> int:
    """Address of the first byte a memoryview exposes."""
    return np.frombuffer(mv, dtype=np.uint8).ctypes.data


# ---------------------------------------------------------------- PIN_MEMORY


@cpu_only
def test_pin_memory_false_on_cpu_with_reason_logged_once(caplog):
    assert PIN_MEMORY is False
    tu.is_pin_memory_available.cache_clear()
    try:
        with caplog.at_level(logging.DEBUG, logger="vllm_rs.tensor_utils"):
            results = [tu.is_pin_memory_available() for _ in range(3)]
    finally:
        tu.is_pin_memory_available.cache_clear()
    assert results == [False, False, False]
    records = [r for r in caplog.records if r.name == "vllm_rs.tensor_utils"]
    assert len(records) == 1
    assert records[0].levelno == logging.DEBUG
    assert "pin_memory=False" in records[0].getMessage()
    assert tu._pin_memory_unavailable_reason() in records[0].getMessage()


@needs_cuda
def test_pin_memory_true_with_cuda():
    assert PIN_MEMORY is True
    assert tu._pin_memory_unavailable_reason() is None


# ---------------------------------------------------------------- CpuGpuBuffer


def test_cpu_gpu_buffer_on_cpu_shapes_and_shared_numpy():
    buf = CpuGpuBuffer(4, 3, dtype=torch.int32, device="cpu")
    assert buf.cpu.shape == buf.gpu.shape == (4, 3)
    assert buf.cpu.dtype == buf.gpu.dtype == torch.int32
    assert buf.gpu.device.type == "cpu"
    # .gpu is its own memory, .np is .cpu's memory.
    assert buf.gpu.data_ptr() != buf.cpu.data_ptr()
    assert buf.np.ctypes.data == buf.cpu.data_ptr()
    assert buf.np.shape == (4, 3) and buf.np.dtype == np.int32
    buf.np[1, 2] = 7
    assert buf.cpu[1, 2].item() == 7
    assert not torch.is_inference(buf.cpu)


def test_cpu_gpu_buffer_allocated_normally_under_inference_mode():
    with torch.inference_mode():
        buf = CpuGpuBuffer(2, dtype=torch.float32, device="cpu")
    assert not torch.is_inference(buf.cpu) and not torch.is_inference(buf.gpu)
    buf.cpu += 1  # would raise for an inference tensor outside inference mode
    assert buf.cpu.tolist() == [1.0, 1.0]


def test_cpu_gpu_buffer_copies_first_n_rows_both_ways():
    buf = CpuGpuBuffer(5, 2, dtype=torch.int64, device="cpu")
    buf.np[:] = np.arange(10).reshape(5, 2)
    out = buf.copy_to_gpu(3)
    assert out.data_ptr() == buf.gpu.data_ptr() and out.shape == (3, 2)
    assert buf.gpu.tolist() == [[0, 1], [2, 3], [4, 5], [0, 0], [0, 0]]
    assert buf.copy_to_gpu().data_ptr() == buf.gpu.data_ptr()
    assert torch.equal(buf.gpu, buf.cpu)

    buf.gpu.fill_(-1)
    back = buf.copy_to_cpu(2)
    assert back.data_ptr() == buf.cpu.data_ptr() and back.shape == (2, 2)
    assert buf.np.tolist() == [[-1, -1], [-1, -1], [4, 5], [6, 7], [8, 9]]
    buf.copy_to_cpu()
    assert (buf.np == -1).all()


def test_cpu_gpu_buffer_bfloat16_needs_with_numpy_false():
    with pytest.raises(ValueError) as e:
        CpuGpuBuffer(4, dtype=torch.bfloat16, device="cpu")
    assert str(e.value) == (
        "Bfloat16 torch tensors cannot be directly cast to a numpy array, so call CpuGpuBuffer with with_numpy=False"
    )
    buf = CpuGpuBuffer(4, dtype=torch.bfloat16, device="cpu", with_numpy=False)
    assert buf.cpu.dtype == torch.bfloat16
    assert not hasattr(buf, "np")


@cpu_only
def test_cpu_gpu_buffer_pin_memory_request_ignored_without_cuda():
    buf = CpuGpuBuffer(8, dtype=torch.float32, device="cpu", pin_memory=True)
    assert not buf.cpu.is_pinned()


@needs_cuda
def test_cpu_gpu_buffer_cuda_pinned_roundtrip():
    buf = CpuGpuBuffer(1024, 4, dtype=torch.float32, device="cuda")
    assert buf.cpu.is_pinned() and buf.gpu.is_cuda
    original = np.random.default_rng(0).random((1024, 4), dtype=np.float32)
    buf.np[:] = original
    buf.copy_to_gpu(100)
    torch.cuda.synchronize()
    assert torch.equal(buf.gpu[:100].cpu(), buf.cpu[:100])
    assert buf.gpu[100:].abs().sum().item() == 0
    buf.gpu.fill_(2.0)
    buf.copy_to_cpu(10)
    torch.cuda.synchronize()
    assert (buf.np[:10] == 2.0).all()
    np.testing.assert_array_equal(buf.np[10:], original[10:])


@needs_cuda
def test_cpu_gpu_buffer_unpinned_cpu_to_cuda():
    buf = CpuGpuBuffer(16, dtype=torch.int32, device="cuda", pin_memory=False)
    assert not buf.cpu.is_pinned()
    buf.np[:] = np.arange(16)
    buf.copy_to_gpu()
    torch.cuda.synchronize()
    assert buf.gpu.tolist() == list(range(16))


# ---------------------------------------------------------------- copy_slice


def test_copy_slice_copies_prefix_and_returns_target_slice():
    src = torch.arange(10, dtype=torch.float32)
    dst = torch.zeros(12)
    out = copy_slice(src, dst, 4)
    assert out.data_ptr() == dst.data_ptr() and out.shape == (4,)
    assert dst.tolist() == [0, 1, 2, 3] + [0] * 8
    # Rows of a 2-D tensor.
    src2 = torch.ones(3, 2)
    dst2 = torch.zeros(5, 2)
    copy_slice(src2, dst2, 2)
    assert dst2.sum().item() == 4


@needs_cuda
def test_copy_slice_to_cuda():
    src = torch.arange(8, dtype=torch.int32).pin_memory()
    dst = torch.zeros(8, dtype=torch.int32, device="cuda")
    copy_slice(src, dst, 5)
    torch.cuda.synchronize()
    assert dst.tolist() == [0, 1, 2, 3, 4, 0, 0, 0]


# ---------------------------------------------------------------- tensor_data


def test_tensor_data_contiguous_is_zero_copy():
    t = torch.arange(1000, dtype=torch.float32)
    mv = tensor_data(t)
    assert isinstance(mv, memoryview)
    assert mv.format == "B" and mv.ndim == 1 and mv.nbytes == 4000
    assert _addr(mv) == t.data_ptr()
    # It is the tensor's memory: a write through the tensor shows up.
    t[0] = 1.5
    assert bytes(mv[:4]) == np.float32(1.5).tobytes()


def test_tensor_data_contiguous_slice_keeps_offset_address():
    base = torch.arange(100, dtype=torch.int16)
    t = base[10:20]
    mv = tensor_data(t)
    assert _addr(mv) == t.data_ptr() == base.data_ptr() + 20
    assert bytes(mv) == np.arange(10, 20, dtype=np.int16).tobytes()


def test_tensor_data_multidim_contiguous_zero_copy():
    t = torch.arange(24, dtype=torch.int64).reshape(2, 3, 4)
    mv = tensor_data(t)
    assert _addr(mv) == t.data_ptr()
    assert bytes(mv) == np.arange(24, dtype=np.int64).tobytes()


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4).t(), id="transposed"),
        pytest.param(lambda: torch.arange(20, dtype=torch.int32)[::3], id="strided"),
        pytest.param(lambda: torch.arange(30, dtype=torch.float64).reshape(5, 6)[1:4, 2:5], id="sliced2d"),
        pytest.param(lambda: torch.arange(3, dtype=torch.int8)[None].expand(4, 3), id="expanded"),
    ],
)
def test_tensor_data_non_contiguous_matches_contiguous_bytes(make):
    t = make()
    assert not t.is_contiguous()
    mv = tensor_data(t)
    expected = t.contiguous().numpy().tobytes()
    assert bytes(mv) == expected
    assert mv.nbytes == t.numel() * t.element_size()
    # A copy was needed: the view is not the tensor's memory.
    assert _addr(mv) != t.data_ptr()


def test_tensor_data_zero_size():
    for t in (torch.zeros(0), torch.zeros(3, 0, dtype=torch.bfloat16), torch.zeros(4)[2:2]):
        mv = tensor_data(t)
        assert mv.nbytes == 0 and bytes(mv) == b""


def test_tensor_data_zero_dim():
    t = torch.tensor(3.5, dtype=torch.float32)
    mv = tensor_data(t)
    assert bytes(mv) == np.float32(3.5).tobytes()
    assert _addr(mv) == t.data_ptr()


def test_tensor_data_bool():
    t = torch.tensor([True, False, True])
    assert bytes(tensor_data(t)) == b"\x01\x00\x01"
    assert bytes(tensor_data(torch.tensor(False))) == b"\x00"


def test_tensor_data_bfloat16_contiguous_and_not():
    values = [1.0, -2.0, 0.5, 3.0, 8.0, -0.25]
    t = torch.tensor(values, dtype=torch.bfloat16).reshape(2, 3)
    mv = tensor_data(t)
    assert _addr(mv) == t.data_ptr()
    # bfloat16 is the top half of float32.
    as_f32 = np.array(values, dtype=np.float32).view(np.uint32) >> 16
    assert bytes(mv) == as_f32.astype(np.uint16).tobytes()
    tt = t.t()
    expected = np.array(values, dtype=np.float32).reshape(2, 3).T.copy().view(np.uint32) >> 16
    assert bytes(tensor_data(tt)) == expected.astype(np.uint16).tobytes()


def test_tensor_data_requires_grad_conj_neg_and_odd_strides():
    t = torch.arange(4, dtype=torch.float32, requires_grad=True)
    assert bytes(tensor_data(t)) == np.arange(4, dtype=np.float32).tobytes()
    c = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    assert bytes(tensor_data(c.conj())) == np.array([1 - 2j, 3 + 1j], np.complex64).tobytes()
    # imag of a conjugated tensor is a negative view with stride 2.
    assert bytes(tensor_data(c.conj().imag)) == np.array([-2, 1], np.float32).tobytes()
    one = torch.tensor([1 + 2j]).imag  # one element, stride 2
    assert bytes(tensor_data(one)) == np.float32(2).tobytes()


@needs_cuda
def test_tensor_data_cuda():
    t = torch.arange(64, dtype=torch.float16, device="cuda").reshape(8, 8).t()
    assert bytes(tensor_data(t)) == t.cpu().contiguous().numpy().tobytes()


# ---------------------------------------------------------------- bind_kv_cache


def test_extract_layer_index():
    assert extract_layer_index("model.layers.0.self_attn.attn") == 0
    assert extract_layer_index("encoder.layers.12") == 12
    assert extract_layer_index("3.attn") == 3
    assert extract_layer_index("model.layers.1.attn.0", num_attn_module=2) == 2
    for bad, found in (("model.attn", "no integer"), ("model.layers.1.sub.2", "2 integers")):
        with pytest.raises(ValueError) as e:
            extract_layer_index(bad)
        assert repr(bad) in str(e.value) and found in str(e.value)


def _legacy_layers(*names):
    """Layer objects without a `bind_kv_cache` method (the older API)."""
    return {name: types.SimpleNamespace(kv_cache=None) for name in names}


def _attention_layers(*names):
    """The toy model's attention layers: real modules with vLLM's `bind_kv_cache(tensor)`."""
    return {name: PagedAttention(name, num_heads=1, head_dim=1) for name in names}


def _caches(*names, device="cpu"):
    return {name: torch.full((2,), float(i), device=device) for i, name in enumerate(names)}


def _runner_names(runner, kv_caches):
    """The layer names of the tensors in `runner`, by identity."""
    by_id = {id(t): name for name, t in kv_caches.items()}
    return [by_id[id(t)] for t in runner]


def _bind(ctx, **kwargs):
    """Binds a fresh CPU cache to every layer of `ctx`; returns the caches
    and the layer names in the order the runner's list got them."""
    kv_caches = _caches(*ctx)
    runner: list = []
    bind_kv_cache(kv_caches, ctx, runner, **kwargs)
    return kv_caches, _runner_names(runner, kv_caches)


def test_bind_kv_cache_binds_through_the_layers_own_method_in_index_order():
    names = ["model.layers.10.attn", "model.layers.2.attn", "model.layers.0.attn"]
    ctx = _attention_layers(*names)
    kv_caches, order = _bind(ctx)
    assert order == ["model.layers.0.attn", "model.layers.2.attn", "model.layers.10.attn"]
    for name in names:
        # The tensor itself (vLLM 0.33), not a one-element list.
        assert ctx[name].kv_cache is kv_caches[name]


def test_bound_cache_is_what_the_toy_attention_reads_and_writes():
    layer = PagedAttention("layers.0.attn", num_heads=1, head_dim=2)
    cache = torch.zeros(2, 1, 4, 1, 2)  # [k/v, blocks, block_size, heads, head_dim]
    bind_kv_cache({"layers.0.attn": cache}, {"layers.0.attn": layer}, [])
    k = torch.tensor([[[1.0, 2.0]]])
    v = torch.tensor([[[3.0, 4.0]]])
    meta = AttentionMetadata(torch.tensor([2]), [SequenceSlice(0, 1, torch.tensor([2]), None)])
    out = layer(torch.ones(1, 1, 2), k, v, meta)
    assert cache[0, 0, 2, 0].tolist() == [1.0, 2.0] and cache[1, 0, 2, 0].tolist() == [3.0, 4.0]
    assert out.tolist() == [[3.0, 4.0]]  # one key: attention returns its value


def test_a_cache_bound_after_a_step_is_the_one_the_next_step_writes():
    """The layer keeps views of its cache between steps; binding another
    tensor (the runner reallocating it) must move reads and writes there."""
    layer = PagedAttention("layers.0.attn", num_heads=1, head_dim=2)
    first, second = torch.zeros(2, 1, 4, 1, 2), torch.zeros(2, 1, 4, 1, 2)
    meta = AttentionMetadata(torch.tensor([1]), [SequenceSlice(0, 1, torch.tensor([1]), None)])
    layer.bind_kv_cache(first)
    layer(torch.ones(1, 1, 2), torch.tensor([[[1.0, 2.0]]]), torch.tensor([[[3.0, 4.0]]]), meta)
    layer.bind_kv_cache(second)
    out = layer(torch.ones(1, 1, 2), torch.tensor([[[5.0, 6.0]]]), torch.tensor([[[7.0, 8.0]]]), meta)
    assert first[0, 0, 1, 0].tolist() == [1.0, 2.0] and first[1, 0, 1, 0].tolist() == [3.0, 4.0]
    assert second[0, 0, 1, 0].tolist() == [5.0, 6.0] and second[1, 0, 1, 0].tolist() == [7.0, 8.0]
    assert out.tolist() == [[7.0, 8.0]]


def test_a_layer_without_the_method_gets_the_older_list_form():
    ctx = {**_legacy_layers("layers.1.attn"), **_attention_layers("layers.0.attn")}
    kv_caches = _caches("layers.0.attn", "layers.1.attn")
    bind_kv_cache(kv_caches, ctx, [])
    assert ctx["layers.1.attn"].kv_cache == [kv_caches["layers.1.attn"]]
    assert ctx["layers.1.attn"].kv_cache[0] is kv_caches["layers.1.attn"]
    assert ctx["layers.0.attn"].kv_cache is kv_caches["layers.0.attn"]


def test_gaps_between_layer_indices_keep_the_order():
    # Attention layers of a hybrid model on one pipeline stage (Jamba-like).
    _, order = _bind(_attention_layers("model.layers.28.attn", "model.layers.20.attn"))
    assert order == ["model.layers.20.attn", "model.layers.28.attn"]


def test_draft_and_target_layers_sharing_an_index_interleave():
    names = ["model.layers.0.attn", "model.layers.1.attn", "draft_model.layers.0.attn", "draft_model.layers.1.attn"]
    ctx = _attention_layers(*names)
    kv_caches, order = _bind(ctx)
    assert order == [
        "model.layers.0.attn",
        "draft_model.layers.0.attn",
        "model.layers.1.attn",
        "draft_model.layers.1.attn",
    ]
    assert all(ctx[name].kv_cache is kv_caches[name] for name in names)


def test_self_and_cross_attention_of_one_decoder_layer_keep_their_given_order():
    names = ["decoder.layers.1.encoder_attn", "decoder.layers.0.self_attn", "decoder.layers.1.self_attn"]
    _, order = _bind({**_legacy_layers(names[0]), **_attention_layers(*names[1:])})
    assert order == [
        "decoder.layers.0.self_attn",
        "decoder.layers.1.encoder_attn",
        "decoder.layers.1.self_attn",
    ]


def test_a_shared_index_on_another_device_is_not_implemented_and_changes_nothing():
    names = ["model.layers.0.attn", "draft_model.layers.0.attn", "model.layers.1.attn"]
    kv_caches = _caches(*names, device="meta")
    ctx = _legacy_layers(*names)
    runner: list = []
    with pytest.raises(NotImplementedError) as e:
        bind_kv_cache(kv_caches, ctx, runner)
    for needle in ("'model.layers.0.attn'", "'draft_model.layers.0.attn'", "index 0", "meta"):
        assert needle in str(e.value)
    assert runner == [] and all(layer.kv_cache is None for layer in ctx.values())
    # One layer per index is fine on any device.
    bind_kv_cache({n: kv_caches[n] for n in names[::2]}, ctx, runner)
    assert len(runner) == 2


@needs_cuda
def test_a_shared_index_on_cuda_is_supported():
    names = ["model.layers.0.attn", "draft_model.layers.0.attn"]
    kv_caches = _caches(*names, device="cuda")
    runner: list = []
    bind_kv_cache(kv_caches, _attention_layers(*names), runner)
    assert _runner_names(runner, kv_caches) == names


def test_num_attn_module_orders_sub_modules_within_a_layer():
    names = ["model.layers.1.attn.0", "model.layers.0.attn.1", "model.layers.0.attn.0", "model.layers.1.attn.1"]
    _, order = _bind(_attention_layers(*names), num_attn_module=2)
    assert order == sorted(names)
    with pytest.raises(ValueError, match="num_attn_module must be at least 1, got 0"):
        _bind(_attention_layers(*names), num_attn_module=0)


def test_layers_get_their_views_and_the_runner_keeps_the_allocations():
    names = ["layers.0.attn", "layers.1.attn"]
    kv_caches = {name: torch.arange(8.0) for name in names}
    # E.g. a backend's smaller kernel blocks: same memory, another shape.
    views = {name: t.view(4, 2) for name, t in kv_caches.items()}
    ctx = _attention_layers(*names)
    runner: list = []
    groups = [types.SimpleNamespace(layer_names=list(names))]
    bind_kv_cache(kv_caches, ctx, runner, kv_cache_groups=groups, layer_kv_caches=views)
    assert runner[0] is kv_caches["layers.0.attn"] and runner[1] is kv_caches["layers.1.attn"]
    for name in names:
        assert ctx[name].kv_cache is views[name]
        assert ctx[name].kv_cache.data_ptr() == kv_caches[name].data_ptr()
    # An empty mapping means "no views", as in vLLM.
    ctx = _attention_layers(*names)
    bind_kv_cache(kv_caches, ctx, [], layer_kv_caches={})
    assert ctx["layers.0.attn"].kv_cache is kv_caches["layers.0.attn"]


def test_views_for_other_layers_are_refused_naming_them():
    kv_caches = _caches("layers.0.attn", "layers.1.attn")
    ctx = _legacy_layers("layers.0.attn", "layers.1.attn", "layers.2.attn")
    runner: list = []
    views = {"layers.0.attn": kv_caches["layers.0.attn"], "layers.2.attn": torch.zeros(2)}
    with pytest.raises(ValueError) as e:
        bind_kv_cache(kv_caches, ctx, runner, layer_kv_caches=views)
    assert "missing ['layers.1.attn']" in str(e.value) and "extra ['layers.2.attn']" in str(e.value)
    assert runner == [] and all(layer.kv_cache is None for layer in ctx.values())


@pytest.mark.parametrize("group", [types.SimpleNamespace(), types.SimpleNamespace(layer_names="layers.0.attn"), 3])
def test_a_malformed_kv_cache_group_is_a_type_error(group):
    ctx = _legacy_layers("layers.0.attn")
    runner: list = []
    with pytest.raises(TypeError, match=r"kv_cache_groups\[0\] must have `layer_names`"):
        bind_kv_cache(_caches("layers.0.attn"), ctx, runner, kv_cache_groups=[group])
    assert runner == [] and ctx["layers.0.attn"].kv_cache is None


def test_bind_kv_cache_rejects_non_empty_runner_list():
    ctx = _legacy_layers("layers.0.attn")
    runner = [torch.zeros(1)]
    with pytest.raises(ValueError, match="runner_kv_caches must be empty"):
        bind_kv_cache({"layers.0.attn": torch.zeros(1)}, ctx, runner)
    assert len(runner) == 1 and ctx["layers.0.attn"].kv_cache is None


@pytest.mark.parametrize("bad", ["model.attn", "model.layers.1.experts.3.attn"])
def test_bind_kv_cache_bad_layer_name_names_it(bad):
    names = ["layers.0.attn", bad]
    runner: list = []
    with pytest.raises(ValueError) as e:
        bind_kv_cache({n: torch.zeros(1) for n in names}, _legacy_layers(*names), runner)
    assert bad in str(e.value)
    assert runner == []


def test_bind_kv_cache_layer_missing_from_forward_context():
    runner: list = []
    ctx = _legacy_layers("layers.0.attn")
    with pytest.raises(KeyError, match="layers.1.attn"):
        bind_kv_cache({"layers.0.attn": torch.zeros(1), "layers.1.attn": torch.zeros(1)}, ctx, runner)
    assert runner == [] and ctx["layers.0.attn"].kv_cache is None


# ---------------------------------------------------------------- iteration details


def _seed_compute(so) -> IterationDetails:
    """The seed's loop, verbatim in behaviour."""
    c_req = c_tok = g_req = g_tok = 0
    new_ids = {r.req_id for r in so.scheduled_new_reqs}
    for req_id, n in so.num_scheduled_tokens.items():
        if so.scheduled_cached_reqs.is_context_phase(req_id) or req_id in new_ids:
            c_req += 1
            c_tok += n
        else:
            g_req += 1
            g_tok += n
    stats = so.scheduled_encoder_input_stats
    return IterationDetails(
        c_req,
        c_tok,
        g_req,
        g_tok,
        stats.num_inputs if stats is not None else 0,
        stats.output_tokens if stats is not None else 0,
    )


def test_compute_iteration_details_dataclasses():
    so = SchedulerOutput(
        scheduled_new_reqs=[NewRequestData("a"), NewRequestData("b")],
        scheduled_cached_reqs=CachedRequestData(req_ids=["c", "d", "e"], num_output_tokens=[0, 5, 1]),
        num_scheduled_tokens={"a": 100, "b": 7, "c": 64, "d": 1, "e": 2},
        scheduled_encoder_input_stats=EncoderInputStats(num_inputs=3, output_tokens=576),
    )
    details = compute_iteration_details(so)
    assert details == IterationDetails(3, 171, 2, 3, 3, 576)
    assert details.num_ctx_requests == 3 and details.num_ctx_tokens == 171
    assert details.num_generation_requests == 2 and details.num_generation_tokens == 3
    assert details.num_encoder_inputs == 3 and details.num_encoder_output_tokens == 576
    assert so.total_num_scheduled_tokens == 174


def test_compute_iteration_details_encoder_stats_none_and_empty():
    assert compute_iteration_details(SchedulerOutput()) == IterationDetails(0, 0, 0, 0, 0, 0)
    so = SchedulerOutput(num_scheduled_tokens={"x": 4})  # unknown id: generation
    assert compute_iteration_details(so) == IterationDetails(0, 0, 1, 4)


class _DuckCached:
    """vLLM-like CachedRequestData that is not ours (generic path)."""

    def __init__(self, req_ids, num_output_tokens):
        self._map = dict(zip(req_ids, num_output_tokens))
        self.calls = 0

    def is_context_phase(self, req_id):
        self.calls += 1
        n = self._map.get(req_id)
        return n is not None and n == 0


def test_compute_iteration_details_duck_typed_matches_seed():
    rng = np.random.default_rng(1)
    ids = [f"r{i}" for i in range(300)]
    new = [types.SimpleNamespace(req_id=i) for i in ids[:40]]
    cached_ids = ids[40:]
    outs = [int(x) for x in rng.integers(0, 3, len(cached_ids))]
    nst = {i: int(rng.integers(1, 50)) for i in ids if rng.random() < 0.9}
    for stats in (None, types.SimpleNamespace(num_inputs=2, output_tokens=9)):
        so = types.SimpleNamespace(
            scheduled_new_reqs=new,
            scheduled_cached_reqs=_DuckCached(cached_ids, outs),
            num_scheduled_tokens=nst,
            scheduled_encoder_input_stats=stats,
        )
        got = compute_iteration_details(so)
        assert got == _seed_compute(so)
        assert got.num_ctx_requests + got.num_generation_requests == len(nst)
        # Ours (fast path) on the same data agrees too.
        ours = SchedulerOutput(
            [NewRequestData(r.req_id) for r in new],
            CachedRequestData(cached_ids, outs),
            nst,
            None if stats is None else EncoderInputStats(2, 9),
        )
        assert compute_iteration_details(ours) == got


def test_cached_request_data_checks_lengths_and_context_phase():
    with pytest.raises(ValueError):
        CachedRequestData(req_ids=["a", "b"], num_output_tokens=[0])
    c = CachedRequestData(req_ids=["a", "b"], num_output_tokens=[0, 2])
    assert c.is_context_phase("a") and not c.is_context_phase("b")
    assert not c.is_context_phase("zzz")
    assert c.num_reqs == 2 and CachedRequestData.make_empty().num_reqs == 0


# ---------------------------------------------------------------- profiling scopes


def test_record_function_or_nullcontext_off(monkeypatch):
    monkeypatch.delenv("VLLM_CUSTOM_SCOPES_FOR_PROFILING", raising=False)
    monkeypatch.delenv("VLLM_NVTX_SCOPES_FOR_PROFILING", raising=False)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function_or_nullcontext("vllm_rs_scope_off"):
            torch.ones(4).sum()
    assert "vllm_rs_scope_off" not in {e.name for e in prof.events()}


def test_record_function_or_nullcontext_on(monkeypatch):
    monkeypatch.setenv("VLLM_CUSTOM_SCOPES_FOR_PROFILING", "1")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function_or_nullcontext("vllm_rs_scope_on"):
            torch.ones(4).sum()
    assert "vllm_rs_scope_on" in {e.name for e in prof.events()}
