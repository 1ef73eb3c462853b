"""Sliding-window attention in the paged KV cache, exact to transformers: a
tiny random-init Mistral whose every layer sees only its last WINDOW keys
(`sliding_window`), as float32 safetensors (the torch step) and as float16
ones read in place (the native step), through chunked prefill, prompts and
conversations longer than the window and a prefix-cache hit: every sampled
position's logits within 1e-4 of transformers' (eager attention, which
applies the window) and greedy output equal to `generate`. The blocks the
window has passed go back to the pool as it moves on: a conversation many
times the window's length holds a few blocks at a time, in a cache smaller
than the conversation, and other requests reuse them. Then models with
global layers beside windowed ones (Gemma 3, Qwen2 with
`max_window_layers`): two KV-cache groups, the windowed one freeing its
blocks, the global one keeping them, prefix hits in both."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from vllm_rs.engine import make_engine_config  # noqa: E402
from vllm_rs.engine.core import EngineCore  # noqa: E402
from vllm_rs.engine.kv_cache.block_pool import NULL_BLOCK, BlockPool  # noqa: E402
from vllm_rs.engine.model_loader.registry import resolve_model  # noqa: E402
from vllm_rs.engine.protocol import EngineCoreRequest  # noqa: E402
from vllm_rs.engine.worker.native_executor import NativeExecutor  # noqa: E402

from tests.support.greedy import run_to_completion  # noqa: E402
from tests.support.tiny_models import gemma3_gguf_model, make_hf_model, save_gguf, save_safetensors  # noqa: E402
from tests.test_real_models import _check_against_transformers, one_thread  # noqa: E402, F401

#: Not a multiple of the blocks' 4 or 8 tokens: windows start inside a block.
WINDOW = 10
#: Without an EOS token, `generate` runs each to its length, as the engine does.
NO_SPECIAL_TOKENS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def tiny_mistral(window: int | None = WINDOW):
    """The tiny Mistral of these tests (the same weights whatever its window)."""
    return make_hf_model("mistral", seed=11, sliding_window=window, **NO_SPECIAL_TOKENS)


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    """The transformers model and its checkpoints: float32 (the torch step)
    and float16 (the same values, read in place by the native step)."""
    root = tmp_path_factory.mktemp("tiny-mistral-swa")
    model = tiny_mistral()
    paths = {
        "torch": save_safetensors(model, str(root / "f32")),
        "native": save_safetensors(tiny_mistral().half(), str(root / "f16")),
    }
    return model, paths


def test_the_window_applies_instead_of_capping_the_length(mistral):
    model, paths = mistral
    spec = resolve_model(paths["torch"])
    assert spec.kv_window == WINDOW
    assert spec.max_position == model.config.max_position_embeddings > WINDOW
    # The reference applies the window: without it, a long prompt's last logits differ.
    prompt = torch.arange(1, 3 * WINDOW)[None] % model.config.vocab_size
    unwindowed = tiny_mistral(window=None)
    with torch.no_grad():
        assert not torch.allclose(model(prompt).logits[0, -1], unwindowed(prompt).logits[0, -1], atol=1e-3)
        # ... and within the window it changes nothing.
        short = prompt[:, :WINDOW]
        torch.testing.assert_close(model(short).logits, unwindowed(short).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("step", ["torch", "native"])
def test_logits_and_greedy_match_transformers(mistral, step):
    """Prompts up to 4x the window in chunks of 16, 8 tokens generated."""
    model, paths = mistral
    quantization = None if step == "native" else "none"
    core = _check_against_transformers(model, paths[step], seed=1, quantization=quantization, prefix_hit=False)
    assert (core.runner.executor.native_step is not None) == (step == "native")
    assert [group.window for group in core.scheduler.kv_cache_manager.groups] == [WINDOW]


def _held(block_ids: list[int]) -> int:
    return sum(1 for block in block_ids if block != NULL_BLOCK)


def _run_alone(core: EngineCore, prompt: list[int], max_tokens: int) -> tuple[list[int], list[tuple[list, float]]]:
    """`prompt`'s greedy tokens, run alone through `core`, and after each
    step that leaves it scheduled, its block tables (one per KV-cache group,
    copied) and the cache's KV usage."""
    core.add_request(EngineCoreRequest("alone", prompt, {"temperature": 0.0, "max_tokens": max_tokens}))
    tokens: list[int] = []
    steps: list[tuple[list, float]] = []
    while core.has_work():
        for _, output in core.step():
            tokens.extend(output.new_token_ids)
        request = core.scheduler.requests.get("alone")
        if request is not None:
            steps.append(([list(table) for table in request.block_ids], core.scheduler_stats().kv_cache_usage))
    return tokens, steps


@pytest.mark.parametrize("step", ["torch", "native"])
def test_a_long_conversation_holds_its_window_not_its_length(mistral, step):
    """Two conversations of 12 + 100 tokens each (29 blocks of 4 tokens
    each) run together in a cache of 12 blocks without a preemption: each
    holds at most the blocks of its window and a step's tokens, the KV usage
    stays there, the blocks freed behind one are taken by the other, and
    greedy output equals transformers' `generate`."""
    model, paths = mistral
    config = make_engine_config(paths[step], device="cpu", block_size=4, num_gpu_blocks=12,
                                max_num_batched_tokens=8, quantization=None if step == "native" else "none")  # fmt: skip
    core = EngineCore(config)
    kv = core.scheduler.kv_cache_manager
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, model.config.vocab_size, 12).tolist() for _ in range(2)]
    max_tokens = 100
    for i, prompt in enumerate(prompts):
        core.add_request(EngineCoreRequest(f"r{i}", prompt, {"temperature": 0.0, "max_tokens": max_tokens}))
    # A step computes at most 8 tokens: the window's 9 keys before them and
    # those 8 span at most 5 blocks; one decode's, at most 4.
    assert kv.blocks_held_at_most(12 + max_tokens, 8) == 5
    outputs: dict[str, list[int]] = {}
    most_held, most_usage = 0, 0.0
    holders: dict[int, set[str]] = {}
    while core.has_work():
        for _, output in core.step():
            outputs.setdefault(output.request_id, []).extend(output.new_token_ids)
        for request in core.scheduler.running:
            (table,) = request.block_ids  # one KV-cache group
            most_held = max(most_held, _held(table))
            for block in table:
                holders.setdefault(block, set()).add(request.request_id)
        most_usage = max(most_usage, core.scheduler_stats().kv_cache_usage)
    assert core.scheduler.num_preemptions == 0
    assert most_held <= 5 and most_usage <= 10 / 12
    # Blocks one conversation's window left behind were taken by the other.
    assert any(len(ids) == 2 for block, ids in holders.items() if block != NULL_BLOCK)
    assert kv.block_pool.num_free_blocks == 12
    assert core.scheduler_stats().kv_cache_usage == 0.0
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            # (No pad token: one would mask the prompt's tokens equal to it.)
            expected = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False)
        assert outputs[f"r{i}"] == expected[0, len(prompt) :].tolist()


@pytest.mark.parametrize("step", ["torch", "native"])
def test_preempted_windowed_requests_resume_exactly(mistral, step):
    """Four requests, one with a prompt longer than the whole cache (80
    tokens; 10 blocks of 4 hold 40), in a cache that holds two at a time:
    some are preempted and admitted again (their computed blocks found in
    the prefix cache, those before the window not taken), and every greedy
    output equals transformers' `generate`."""
    model, paths = mistral
    config = make_engine_config(paths[step], device="cpu", block_size=4, num_gpu_blocks=10, max_num_batched_tokens=8,
                                quantization=None if step == "native" else "none")  # fmt: skip
    core = EngineCore(config)
    rng = np.random.default_rng(8)
    prompts = [rng.integers(0, model.config.vocab_size, n).tolist() for n in (80, 20, 20, 20)]
    for i, prompt in enumerate(prompts):
        core.add_request(EngineCoreRequest(f"r{i}", prompt, {"temperature": 0.0, "max_tokens": 30}))
    outputs = run_to_completion(core)
    assert core.scheduler.num_preemptions > 0
    assert core.scheduler.kv_cache_manager.block_pool.num_free_blocks == 10
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            expected = model.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)
        assert outputs[f"r{i}"] == expected[0, len(prompt) :].tolist(), i


def test_a_prefix_hit_needs_only_the_blocks_its_window_reads(mistral):
    """A second conversation sharing 24 tokens (6 blocks) with a finished
    one: the blocks before its window are not taken (NULL_BLOCK), the ones
    the window reads are the first's, and its logits equal those computed
    without the cache."""
    model, paths = mistral
    rng = np.random.default_rng(9)
    shared = rng.integers(0, model.config.vocab_size, 24).tolist()
    first, second = shared + [3, 4, 5], shared + rng.integers(0, model.config.vocab_size, 7).tolist()

    def run(enable_prefix_caching: bool) -> tuple[EngineCore, list[np.ndarray], dict[str, list[int]]]:
        """The second's sampled logits rows, and each request's table: the
        first's blocks by position (as it held them), the second's as admitted."""
        config = make_engine_config(paths["torch"], device="cpu", block_size=4, num_gpu_blocks=64,
                                    max_num_batched_tokens=8, quantization="none",
                                    enable_prefix_caching=enable_prefix_caching)  # fmt: skip
        core = EngineCore(config)
        rows: list[np.ndarray] = []
        tables: dict[str, list[int]] = {"first": [NULL_BLOCK] * 9}
        sample, allocate = core.runner.sampler.sample, core.scheduler.kv_cache_manager.allocate

        def recording_sample(logits, requests):
            rows.extend(row.copy() for row, r in zip(logits, requests, strict=True) if r.request_id == "second")
            return sample(logits, requests)

        def recording_allocate(request, step_tokens):
            admitted = allocate(request, step_tokens)
            tables.setdefault(request.request_id, list(request.block_ids[0]))
            return admitted

        core.runner.sampler.sample = recording_sample
        core.scheduler.kv_cache_manager.allocate = recording_allocate
        params = {"temperature": 0.0, "max_tokens": 6}
        core.add_request(EngineCoreRequest("first", first, params))
        while core.has_work():
            core.step()
            held = core.scheduler.requests.get("first")
            for i, block in enumerate(held.block_ids[0] if held else []):
                tables["first"][i] = block if block != NULL_BLOCK else tables["first"][i]
        core.add_request(EngineCoreRequest("second", second, params))
        while core.has_work():
            core.step()
        return core, rows, tables

    cached, cached_rows, tables = run(True)
    fresh, fresh_rows, _ = run(False)
    # 6 whole blocks hit; the query at 24 sees keys 15..24: the first's blocks 3 to 5, then 2 new ones.
    assert cached.scheduler.kv_cache_manager.block_pool.hits == 6
    table = tables["second"]
    assert table[:3] == [NULL_BLOCK] * 3 and table[3:6] == tables["first"][3:6] and len(table) == 8
    assert NULL_BLOCK not in table[3:]
    assert len(cached_rows) == len(fresh_rows) == 6
    for ours, theirs in zip(cached_rows, fresh_rows, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    with torch.no_grad():
        reference = model(torch.tensor([second])).logits[0, -1].numpy()
    np.testing.assert_allclose(cached_rows[0], reference, atol=1e-4, rtol=0)


def test_find_cached_window_takes_the_longest_prefix_whose_window_is_cached():
    pool = BlockPool(8, enable_caching=True)
    hashes = [bytes([i]) for i in range(6)]
    blocks = pool.allocate([], 6)
    for i in (1, 2, 4):
        pool.register(blocks[i], hashes[i])
    # Blocks 1 and 2 end the longest prefix with two cached blocks at its end.
    assert pool.find_cached_window(hashes, 2) == [NULL_BLOCK, blocks[1], blocks[2]]
    assert pool.find_cached_window(hashes, 1) == [NULL_BLOCK] * 4 + [blocks[4]]
    assert pool.find_cached_window(hashes, 3) == []
    # A prefix cached whole is a hit even when shorter than the window's blocks.
    pool.register(blocks[0], hashes[0])
    assert pool.find_cached_window(hashes, 4) == blocks[:3]
    assert BlockPool(8, enable_caching=False).find_cached_window(hashes, 1) == []


# Two KV-cache groups: global layers beside windowed ones.

GEMMA3_WINDOW = 8  # tests/support/tiny_models.py's tiny Gemma 3: 5 windowed layers, 1 global


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """The tiny Gemma 3 (transformers) and its checkpoints: float32 (the
    torch step) and float16 (the same values, read in place by the native step)."""
    model = make_hf_model("gemma3_text", seed=5, **NO_SPECIAL_TOKENS)
    root = tmp_path_factory.mktemp("tiny-gemma3-swa")
    paths = {
        "torch": save_safetensors(model, str(root / "st")),
        "native": save_safetensors(copy.deepcopy(model).half(), str(root / "f16")),
    }
    return model, paths


@pytest.mark.parametrize("step", ["torch", "native"])
def test_gemma3_frees_the_windowed_layers_blocks_and_keeps_the_global_ones(gemma3, step):
    """A conversation of 12 + 60 tokens (18 blocks): the global layers'
    group holds every block, the windowed layers' group the blocks of its
    window and a step; the KV usage weighs each group by its layers; greedy
    output equals transformers' `generate`, on the torch step and on the
    native one (each layer reading its group's slots)."""
    model, paths = gemma3
    path = paths[step]
    spec = resolve_model(path)
    assert spec.kv_groups == (None, GEMMA3_WINDOW) and spec.kv_group_layers() == [1, 5]
    config = make_engine_config(path, device="cpu", block_size=4, num_gpu_blocks=20, max_num_batched_tokens=8,
                                quantization=None if step == "native" else "none")  # fmt: skip
    core = EngineCore(config)
    assert (core.runner.executor.native_step is not None) == (step == "native")
    kv = core.scheduler.kv_cache_manager
    assert [(g.window, g.num_layers, g.block_pool.num_blocks) for g in kv.groups] == [(None, 1, 20), (8, 5, 20)]
    prompt = np.random.default_rng(2).integers(0, model.config.vocab_size, 12).tolist()
    tokens, steps = _run_alone(core, prompt, 60)
    for (global_table, windowed_table), usage in steps:
        assert NULL_BLOCK not in global_table and len(windowed_table) == len(global_table)
        assert usage == pytest.approx((len(global_table) + 5 * _held(windowed_table)) / (6 * 20))
    most_windowed = max(_held(windowed) for (_, windowed), _ in steps)
    windowed_table = steps[-1][0][1]
    # 7 keys before a step of 8 span at most 4 blocks of 4; the table grew to 18.
    assert most_windowed <= 4 and len(windowed_table) == 18 and _held(windowed_table) <= 3
    assert core.scheduler_stats().kv_cache_usage == 0.0
    with torch.no_grad():
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False)
    assert tokens == expected[0, len(prompt) :].tolist()


def test_gemma3_prefix_hit_takes_every_global_block_and_the_windows_own(gemma3):
    """A second prompt sharing 24 tokens (6 blocks) with a finished one: the
    global group's table takes the 6 cached blocks, the windowed group's
    only the 2 its window reads (7 keys before position 24), and the
    logits equal transformers'."""
    model, paths = gemma3
    path = paths["torch"]
    rng = np.random.default_rng(4)
    shared = rng.integers(0, model.config.vocab_size, 24).tolist()
    second = shared + rng.integers(0, model.config.vocab_size, 5).tolist()
    config = make_engine_config(path, device="cpu", block_size=4, num_gpu_blocks=64, max_num_batched_tokens=8,
                                quantization="none")  # fmt: skip
    core = EngineCore(config)
    tables: dict[str, list[list[int]]] = {}
    allocate = core.scheduler.kv_cache_manager.allocate

    def recording_allocate(request, step_tokens):
        admitted = allocate(request, step_tokens)
        tables.setdefault(request.request_id, [list(table) for table in request.block_ids])
        return admitted

    core.scheduler.kv_cache_manager.allocate = recording_allocate
    rows: list[np.ndarray] = []
    sample = core.runner.sampler.sample

    def recording_sample(logits, requests):
        rows.extend(row.copy() for row, r in zip(logits, requests, strict=True) if r.request_id == "second")
        return sample(logits, requests)

    core.runner.sampler.sample = recording_sample
    core.add_request(EngineCoreRequest("first", shared + [1, 2, 3], {"temperature": 0.0, "max_tokens": 2}))
    while core.has_work():
        core.step()
    core.add_request(EngineCoreRequest("second", second, {"temperature": 0.0, "max_tokens": 1}))
    while core.has_work():
        core.step()
    global_table, windowed_table = tables["second"]
    assert NULL_BLOCK not in global_table and len(global_table) == len(windowed_table) == 8
    assert windowed_table[:4] == [NULL_BLOCK] * 4 and NULL_BLOCK not in windowed_table[4:]
    assert core.scheduler.requests == {} and core.scheduler.kv_cache_manager.usage == 0.0
    with torch.no_grad():
        reference = model(torch.tensor([second])).logits[0, -1].numpy()
    np.testing.assert_allclose(rows[0], reference, atol=1e-4, rtol=0)


def test_qwen2_with_some_windowed_layers_matches_transformers(tmp_path):
    """Qwen2's `use_sliding_window` from `max_window_layers` on: layer 0
    global, layer 1 windowed, two KV-cache groups, in `llama.py`'s decoder
    and in the native step."""
    model = make_hf_model("qwen2", seed=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                          **NO_SPECIAL_TOKENS)  # fmt: skip
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    path = save_safetensors(model, str(tmp_path / "qwen2"))
    assert resolve_model(path).kv_groups == (None, WINDOW)
    core = _check_against_transformers(model, path, seed=1)
    assert core.runner.executor.native_step is None
    half = save_safetensors(copy.deepcopy(model).half(), str(tmp_path / "qwen2-f16"))
    core = _check_against_transformers(model, half, seed=1, quantization=None)
    assert core.runner.executor.native_step is not None


def test_the_native_executor_runs_two_kv_groups(tmp_path):
    """A Gemma 3 GGUF (two groups) on the torch-free executor: its windowed
    layers' blocks freed, greedy output equal to transformers' `generate`."""
    pytest.importorskip("gguf")
    model = gemma3_gguf_model(seed=6)
    path = save_gguf(model, str(tmp_path / "g.gguf"), f16=True)
    config = make_engine_config(path, device="cpu", block_size=4, num_gpu_blocks=20, max_num_batched_tokens=8)
    core = EngineCore(config)
    assert isinstance(core.runner.executor, NativeExecutor)
    prompt = np.random.default_rng(3).integers(0, model.config.vocab_size, 12).tolist()
    tokens, steps = _run_alone(core, prompt, 40)
    assert max(_held(windowed) for (_, windowed), _ in steps) <= 4
    with torch.no_grad():
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)
    assert tokens == expected[0, len(prompt) :].tolist()
