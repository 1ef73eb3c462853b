"""Pooling through `python -m vllm_rs serve` on tiny random-init checkpoints
written by the test (no download, no model package): a sentence-transformers
BERT folder whose tokenizer.json pads and truncates (as all-MiniLM-L6-v2's
does; prompts must reach the engine whole and unpadded), and a BERT
cross-encoder behind `/score`, `/rerank` and `/classify`, each answer
compared with sentence-transformers or transformers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.pooling_checkpoints import write_bert, write_cross_encoder
from tests.test_serve import rust_frontend_available, serving

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if not rust_frontend_available():
    pytest.skip("the vllm-rs binary is not built", allow_module_level=True)

TEXTS = ["the cat sat on the mat", "a dog", "the red car ran fast on the old road", "sun and moon"]
QUERY = "the cat"
DOCUMENTS = ["the cat sat on the mat", "a big old dog ran", "the sun is hot", "a red car", "the cat and the dog"]


def pad_tokenizer_json(path: str) -> None:
    """Gives the folder's tokenizer.json fixed padding and truncation."""
    with open(f"{path}/tokenizer.json", encoding="utf-8") as f:
        config = json.load(f)
    config["padding"] = {"strategy": {"Fixed": 48}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                         "pad_type_id": 0, "pad_token": "[PAD]"}  # fmt: skip
    config["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    with open(f"{path}/tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(config, f)


def post(serve, path: str, body: dict) -> dict:
    status, data = serve.http("POST", path, body)
    assert status == 200, data
    return json.loads(data)


def metric(text: str, name: str, label: str = "") -> float:
    """The sum of a metric's samples whose labels hold `label`."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and label in line)  # fmt: skip


def test_embeddings_of_a_sentence_transformers_folder(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    path = write_bert(str(tmp_path / "bert"), st_pooling="mean_tokens", normalize=True)
    want = st.SentenceTransformer(path, device="cpu").encode(TEXTS, convert_to_numpy=True)
    pad_tokenizer_json(path)
    with serving("--model", path, "--port", "0", "--host", "127.0.0.1") as serve:
        answer = post(serve, "/v1/embeddings", {"input": TEXTS})
        got = np.array([d["embedding"] for d in answer["data"]], dtype=np.float32)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        assert answer["usage"]["prompt_tokens"] == sum(len(tokenizer(t)["input_ids"]) for t in TEXTS)
        status, metrics = serve.http("GET", "/metrics")
        assert metric(metrics.decode(), "vllm:request_success_total", 'finished_reason="stop"') == len(TEXTS)
        assert metric(metrics.decode(), "vllm:prompt_tokens_total") == answer["usage"]["prompt_tokens"]
        status, data = serve.http("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert status == 400
        assert json.loads(data)["error"]["message"] == "The model does not support Chat Completions API"


def test_cross_encoder_scores_reranks_and_classifies(tmp_path):
    from transformers import AutoTokenizer, BertForSequenceClassification

    path = write_cross_encoder(str(tmp_path / "ce"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = BertForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        logits = [model(**tokenizer(QUERY, d, return_tensors="pt")).logits[0, 0].item() for d in DOCUMENTS]
    want = 1 / (1 + np.exp(-np.array(logits)))
    with serving("--model", path, "--port", "0", "--host", "127.0.0.1") as serve:
        scores = post(serve, "/score", {"text_1": QUERY, "text_2": DOCUMENTS})
        np.testing.assert_allclose([d["score"] for d in scores["data"]], want, atol=1e-5, rtol=0)
        raw = post(serve, "/v1/score", {"queries": QUERY, "documents": DOCUMENTS, "use_activation": False})
        np.testing.assert_allclose([d["score"] for d in raw["data"]], logits, atol=1e-5, rtol=0)
        ranked = post(serve, "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 3})
        assert [r["index"] for r in ranked["results"]] == list(np.argsort(-want, kind="stable")[:3])
        classified = post(serve, "/classify", {"input": TEXTS[:2]})
        assert [d["num_classes"] for d in classified["data"]] == [1, 1]
        status, data = serve.http("POST", "/v1/embeddings", {"input": "hi"})
        assert status == 400 and json.loads(data)["error"]["message"] == "The model does not support Embeddings API"


def test_classify_names_the_best_class_from_id2label(tmp_path):
    """A classifier whose config.json names its classes: `/classify`
    answers transformers' softmax and the name of its best class, as vLLM
    takes it from `id2label`."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    names = {0: "negative", 1: "positive"}
    path = write_cross_encoder(str(tmp_path / "sentiment"), id2label=names)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = BertForSequenceClassification.from_pretrained(path).eval()
    batch = [tokenizer(text, return_tensors="pt") for text in TEXTS]
    # Random weights favour one class for every input, which a label that
    # ignored the scores would pass: widen the classifier and move its bias
    # to the middle of the inputs' logit differences, so they split.
    with torch.no_grad():
        model.classifier.weight *= 100
        logits = torch.cat([model(**enc).logits for enc in batch])
        margins = logits[:, 1] - logits[:, 0]
        model.classifier.bias[1] -= (margins.max() + margins.min()) / 2
        want = torch.cat([torch.softmax(model(**enc).logits, -1) for enc in batch]).numpy()
    model.save_pretrained(path)
    assert sorted(set(want.argmax(-1))) == [0, 1], want
    with serving("--model", path, "--port", "0", "--host", "127.0.0.1") as serve:
        classified = post(serve, "/classify", {"input": TEXTS})
    np.testing.assert_allclose([d["probs"] for d in classified["data"]], want, atol=1e-5, rtol=0)
    assert [d["label"] for d in classified["data"]] == [names[int(i)] for i in want.argmax(-1)]
    assert [d["num_classes"] for d in classified["data"]] == [2] * len(TEXTS)


def test_a_decoder_embeds_chat_messages_with_runner_pooling(tmp_path):
    """Qwen3 with `--runner pooling`: a chat conversation embeds as its
    rendered template's tokens do, and equals transformers' last hidden
    state of the last token, normalized."""
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from tests.pooling_checkpoints import write_qwen3

    path = write_qwen3(str(tmp_path / "qwen3"))
    with open(f"{path}/tokenizer_config.json", encoding="utf-8") as f:
        config = json.load(f)
    config["chat_template"] = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    with open(f"{path}/tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(config, f)
    tokenizer = AutoTokenizer.from_pretrained(path)
    messages = [{"role": "user", "content": "the cat sat"}, {"role": "assistant", "content": "on the mat"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    model = Qwen3ForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        want = torch.nn.functional.normalize(model.model(torch.tensor([ids])).last_hidden_state[0, -1], dim=-1)
    with serving("--model", path, "--runner", "pooling", "--port", "0", "--host", "127.0.0.1") as serve:
        by_chat = post(serve, "/v1/embeddings", {"messages": messages})
        by_ids = post(serve, "/v1/embeddings", {"input": [ids]})
        assert by_chat["usage"]["prompt_tokens"] == len(ids)
        assert by_chat["data"][0]["embedding"] == by_ids["data"][0]["embedding"]
        np.testing.assert_allclose(by_chat["data"][0]["embedding"], want.numpy(), atol=1e-5, rtol=0)
