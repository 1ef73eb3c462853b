"""The reference engine's pooling models against sentence-transformers and
transformers on tiny random-init checkpoints (fp32, within 1e-5): BERT
embeddings with each pooling type, normalized and not, read from a
sentence-transformers folder or set with `--pooler-config`; a Qwen3 decoder
embedding with last-token pooling; a cross-encoder's scores; and the
engine's refusals (wrong task, dimensions without Matryoshka)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from vllm_rs.engine.config import make_engine_config  # noqa: E402
from vllm_rs.engine.core import EngineCore  # noqa: E402
from vllm_rs.engine.model_loader.pooler_config import PoolerConfig  # noqa: E402
from vllm_rs.engine.protocol import EngineCoreRequest, FinishReason  # noqa: E402

from tests.pooling_checkpoints import write_bert, write_cross_encoder, write_qwen3  # noqa: E402

#: Inputs of different lengths (3 to 17 tokens), batched together in one
#: step: several of the encoder's attention groups (models/bert.py).
TEXTS = [
    "the cat sat on the mat",
    "a dog",
    "the red car ran fast on the old road and the blue car was slow",
    "sun",
    "we sat in the big old house and they ran out",
]
TOLERANCE = 1e-5


def pooling_params(task: str, **fields) -> list:
    """vLLM 0.33's PoolingParams array, trailing defaults left out."""
    slots = ["use_activation", "dimensions", "step_tag_id", "returned_token_ids", "task", "requires_token_ids",
             "skip_reading_prefix_cache", "late_interaction_params", "extra_kwargs"]  # fmt: skip
    fields["task"] = task
    last = max(slots.index(k) for k in fields)
    return [fields.get(k) for k in slots[: last + 1]]


def run_pooled(core: EngineCore, inputs: list[tuple[list[int], list]]) -> list:
    """Adds every input, steps until done; each input's output (in order)."""
    for i, (ids, params) in enumerate(inputs):
        refused = core.add_request(EngineCoreRequest(f"r{i}", ids, None, pooling_params=params))
        assert refused is None, refused.error
    outputs = {}
    steps = 0
    while core.has_work():
        steps += 1
        outputs.update((o.request_id, o) for _, o in core.step())
    assert steps == 1, "every input is pooled in one step"
    return [outputs[f"r{i}"] for i in range(len(inputs))]


def vector(output) -> np.ndarray:
    """The float32 vector of a pooled output, decoded from its wire form."""
    assert output.finish_reason == FinishReason.STOP
    dtype, shape, data = output.pooling_output
    assert dtype == "float32"
    return np.frombuffer(data.data, dtype=np.float32).reshape(shape)


def tokenize(path: str, texts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return [tokenizer(t)["input_ids"] for t in texts]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> str:
    return write_bert(str(tmp_path_factory.mktemp("bert")))


ST_MODES = {"CLS": "cls_token", "MEAN": "mean_tokens", "LAST": "lasttoken"}


def st_model(path: str, mode: str | None, normalize: bool):
    """sentence-transformers' model of `path` built from its modules: the
    transformer, pooling `mode` (`cls`, `mean`, `lasttoken`), Normalize."""
    st = pytest.importorskip("sentence_transformers")
    try:
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:  # before sentence-transformers 6
        from sentence_transformers.models import Normalize, Pooling, Transformer
    modules = [Transformer(path), Pooling(32, pooling_mode=mode)]
    return st.SentenceTransformer(modules=[*modules, Normalize()] if normalize else modules, device="cpu")


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("pooling_type", ["CLS", "MEAN", "LAST"])
def test_bert_embeddings_equal_sentence_transformers(bert_dir, pooling_type, normalize):
    reference = st_model(bert_dir, ST_MODES[pooling_type].split("_")[0], normalize).encode(TEXTS, convert_to_numpy=True)
    pooler = PoolerConfig(pooling_type=pooling_type, use_activation=normalize)
    core = EngineCore(make_engine_config(bert_dir, device="cpu", pooler_config=pooler))
    ours = run_pooled(core, [(ids, pooling_params("embed")) for ids in tokenize(bert_dir, TEXTS)])
    for got, want in zip(ours, reference, strict=True):
        np.testing.assert_allclose(vector(got), want, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize(("mode", "normalize"), [("mean_tokens", True), ("cls_token", False), ("lasttoken", True)])
def test_sentence_transformers_folder_sets_the_pooling(tmp_path, mode, normalize):
    st = pytest.importorskip("sentence_transformers")
    path = write_bert(str(tmp_path / "st"), seed=1, st_pooling=mode, normalize=normalize)
    reference = st.SentenceTransformer(path, device="cpu").encode(TEXTS, convert_to_numpy=True)
    core = EngineCore(make_engine_config(path, device="cpu"))
    assert core.config.model_config.pooler == PoolerConfig(
        pooling_type={v: k for k, v in ST_MODES.items()}[mode], use_activation=normalize
    )
    ours = run_pooled(core, [(ids, pooling_params("embed")) for ids in tokenize(path, TEXTS)])
    for got, want in zip(ours, reference, strict=True):
        np.testing.assert_allclose(vector(got), want, atol=TOLERANCE, rtol=0)


def test_request_use_activation_false_skips_the_models_normalization(tmp_path):
    path = write_bert(str(tmp_path / "st"), st_pooling="mean_tokens", normalize=True)
    reference = st_model(path, "mean", False).encode(TEXTS, convert_to_numpy=True)
    core = EngineCore(make_engine_config(path, device="cpu"))
    ours = run_pooled(core, [(ids, pooling_params("embed", use_activation=False)) for ids in tokenize(path, TEXTS)])
    for got, want in zip(ours, reference, strict=True):
        np.testing.assert_allclose(vector(got), want, atol=TOLERANCE, rtol=0)


def test_qwen3_embeds_with_last_token_pooling(tmp_path):
    from transformers import Qwen3ForCausalLM

    path = write_qwen3(str(tmp_path / "qwen3"))
    core = EngineCore(make_engine_config(path, device="cpu", runner="pooling", convert="embed"))
    assert core.config.model_config.pooler.pooling_type == "LAST"
    token_ids = tokenize(path, TEXTS)
    ours = run_pooled(core, [(ids, pooling_params("embed")) for ids in token_ids])
    model = Qwen3ForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for ids, got in zip(token_ids, ours, strict=True):
            hidden = model.model(torch.tensor([ids])).last_hidden_state[0, -1]
            want = torch.nn.functional.normalize(hidden, dim=-1).numpy()
            np.testing.assert_allclose(vector(got), want, atol=TOLERANCE, rtol=0)


PAIRS = [("the cat", "the cat sat on the mat"), ("a red car", "the sun is hot"), ("big dog", "a big old dog ran")]


@pytest.mark.parametrize("num_labels", [1, 3])
def test_cross_encoder_scores_equal_its_logits(tmp_path, num_labels):
    from transformers import AutoTokenizer, BertForSequenceClassification

    path = write_cross_encoder(str(tmp_path / "ce"), num_labels=num_labels)
    core = EngineCore(make_engine_config(path, device="cpu"))
    assert core.get_supported_tasks() == ["classify"]
    assert "does not support ['dimensions']" in refusal(core, pooling_params("classify", dimensions=8))
    tokenizer = AutoTokenizer.from_pretrained(path)
    encoded = [tokenizer(q, d) for q, d in PAIRS]
    inputs = []
    for enc in encoded:
        start = enc["token_type_ids"].index(1)
        extra = {"compressed_token_type_ids": start}
        inputs.append((enc["input_ids"], pooling_params("classify", use_activation=False, extra_kwargs=extra)))
        inputs.append((enc["input_ids"], pooling_params("classify", extra_kwargs=extra)))
    ours = run_pooled(core, inputs)
    model = BertForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        for i, enc in enumerate(encoded):
            logits = model(**{k: torch.tensor([v]) for k, v in enc.items()}).logits[0]
            activated = torch.sigmoid(logits) if num_labels == 1 else torch.softmax(logits, -1)
            np.testing.assert_allclose(vector(ours[2 * i]), logits.numpy(), atol=TOLERANCE, rtol=0)
            np.testing.assert_allclose(vector(ours[2 * i + 1]), activated.numpy(), atol=TOLERANCE, rtol=0)


def refusal(core: EngineCore, params: list, ids=(2, 10, 3)) -> str:
    output = core.add_request(EngineCoreRequest("bad", list(ids), None if params else {}, pooling_params=params))
    assert output is not None and output.finish_reason == FinishReason.ERROR
    assert output.error.code == "validation_error"
    return output.error.message


def test_wrong_task_and_parameters_are_refused(bert_dir):
    core = EngineCore(make_engine_config(bert_dir, device="cpu"))
    assert "classify" in refusal(core, pooling_params("classify"))
    assert "does not support Matryoshka embeddings; dimensions must be unset (received dimensions=8)" in refusal(
        core, pooling_params("embed", dimensions=8)
    )
    assert "Unknown pooling task: 'score'" in refusal(core, pooling_params("score"))
    assert "only supports pooling" in refusal(core, None)


def test_a_generate_model_refuses_pooling(tmp_path):
    path = write_qwen3(str(tmp_path / "qwen3"))
    core = EngineCore(make_engine_config(path, device="cpu", num_gpu_blocks=8))
    assert core.get_supported_tasks() == ["generate"]
    assert "does not support pooling" in refusal(core, pooling_params("embed"))


def test_matryoshka_dimensions_cut_the_vector(tmp_path):
    import json
    import os

    path = write_bert(str(tmp_path / "m"))
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["matryoshka_dimensions"] = [8, 16, 32]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    core = EngineCore(make_engine_config(path, device="cpu"))
    ids = tokenize(path, TEXTS[:1])[0]
    full, cut = run_pooled(core, [(ids, pooling_params("embed", use_activation=False)),
                                  (ids, pooling_params("embed", use_activation=False, dimensions=8))])  # fmt: skip
    np.testing.assert_array_equal(vector(cut), vector(full)[:8])
    assert "only supports Matryoshka dimensions [8, 16, 32], got 12" in refusal(
        core, pooling_params("embed", dimensions=12)
    )
    assert "only supports dimensions in range [1, 32], got 64" in refusal(core, pooling_params("embed", dimensions=64))


def test_runner_choice():
    from vllm_rs.engine.model_loader.pooler_config import PoolerConfigError, resolve_runner

    assert resolve_runner("auto", "auto", "BertModel").task == "embed"
    assert resolve_runner("auto", "auto", "BertForSequenceClassification").task == "classify"
    assert not resolve_runner("auto", "auto", "Qwen3ForCausalLM").is_pooling
    assert resolve_runner("pooling", "auto", "Qwen3ForCausalLM").task == "embed"
    with pytest.raises(PoolerConfigError, match="--runner generate"):
        resolve_runner("generate", "auto", "BertModel")


def test_pooler_config_and_limits_are_checked(bert_dir):
    from vllm_rs.engine.config import EngineConfigError
    from vllm_rs.engine.model_loader.pooler_config import PoolerConfigError, parse_pooler_config

    assert parse_pooler_config('{"seq_pooling_type": "MEAN", "use_activation": false}') == PoolerConfig("MEAN", False)
    for bad, flaw in [('{"pooling_type": "MAX"}', "MAX"), ('{"softmax": true}', "softmax"), ("[1]", "object"),
                      ('{"normalize": true}', "`normalize` was removed; use `use_activation`"),
                      ('{"use_activation": 1}', "use_activation"), ('{"dimensions": 0}', "dimensions")]:  # fmt: skip
        with pytest.raises(PoolerConfigError, match=flaw):
            parse_pooler_config(bad)
    with pytest.raises(EngineConfigError, match="--max-num-batched-tokens 16"):
        make_engine_config(bert_dir, device="cpu", max_num_batched_tokens=16)
    with pytest.raises(EngineConfigError, match="cannot pool"):
        make_engine_config("echo", runner="pooling")
