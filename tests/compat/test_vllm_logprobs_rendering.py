"""The Python API server's logprobs against vLLM 0.33's own code: outputs
encoded by vLLM's `MsgpackEncoder` (arrays large enough to travel in aux
frames, a -inf, the sampled token among the top k and not) are read by the
server's decoder and rendered; vLLM's `LogprobsProcessor` and its serving
classes' `_create_completion_logprobs` / `_create_chat_logprobs` render the
same outputs; the JSON must be equal."""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")

import msgspec  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat  # noqa: E402
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest  # noqa: E402
from vllm.v1.engine.logprobs import LogprobsProcessor  # noqa: E402
from vllm.v1.outputs import LogprobsLists, LogprobsTensors  # noqa: E402
from vllm.v1.serial_utils import MsgpackEncoder  # noqa: E402
from vllm_rs.api_server.engine_outputs import decode_engine_message  # noqa: E402
from vllm_rs.api_server.logprobs import (  # noqa: E402
    LogprobRows,
    PositionReader,
    TokenStrings,
    chat_logprobs,
    completion_logprobs,
    prompt_logprobs_json,
)
from vllm_rs.api_server.tokenizer import ByteLevelTokenizer  # noqa: E402

BYTES = ByteLevelTokenizer()
K = 40  # 41 columns: a 41 x 4-byte row is past vLLM's inline threshold with a few rows


class ByteTokenizer:
    """What vLLM's logprobs code asks of a tokenizer, for the byte-level one."""

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return BYTES.decode([ids] if isinstance(ids, int) else ids)


def _rows(sampled: list[int], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = len(sampled)
    top = np.stack([rng.permutation(256)[:K] for _ in range(rows)]).astype(np.int32)
    top[0, 3] = sampled[0]  # the sampled token also among the top k
    ids = np.concatenate([np.asarray(sampled, dtype=np.int32)[:, None], top], axis=1)
    logprobs = -np.sort(rng.exponential(2.0, (rows, K + 1)), axis=1).astype(np.float32)
    logprobs[-1, -1] = -np.inf
    return ids, logprobs, rng.integers(1, 50, rows).astype(np.int64)


def _outputs() -> tuple[list[bytes], EngineCoreOutput]:
    sampled = [104, 0xE2, 0x82, 0xAC, 33]  # "h€!": the euro sign in three byte tokens
    ids, logprobs, ranks = _rows(sampled, 1)
    p_ids, p_logprobs, p_ranks = _rows([98, 99], 2)
    output = EngineCoreOutput(
        request_id="r",
        new_token_ids=sampled,
        new_logprobs=LogprobsLists(ids, logprobs, ranks),
        new_prompt_logprobs_tensors=LogprobsTensors(
            torch.from_numpy(p_ids), torch.from_numpy(p_logprobs), torch.from_numpy(p_ranks)
        ),
    )
    frames = MsgpackEncoder().encode(EngineCoreOutputs(engine_index=0, outputs=[output]))
    return [bytes(f) for f in frames], output


def _vllm_processor(output: EngineCoreOutput) -> LogprobsProcessor:
    request = EngineCoreRequest(
        request_id="r", prompt_token_ids=[97, 98, 99], mm_features=None,
        sampling_params=SamplingParams(logprobs=K, prompt_logprobs=K), pooling_params=None,
        arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None,
    )  # fmt: skip
    processor = LogprobsProcessor.from_new_request(ByteTokenizer(), request)
    processor.update_from_output(output)
    return processor


def _serving(cls, tokens_as_ids: bool):
    serving = object.__new__(cls)
    serving.return_tokens_as_token_ids = tokens_as_ids
    return serving


def _ours():
    frames, output = _outputs()
    assert len(frames) > 1, "the arrays were expected in aux frames"
    (ours,) = decode_engine_message(frames).outputs
    sample = PositionReader(BYTES.decode).read(LogprobRows.of(ours.new_logprobs))
    prompt = [None, *PositionReader(BYTES.decode).read(LogprobRows.of(ours.new_prompt_logprobs))]
    return output, sample, prompt


@pytest.mark.parametrize("tokens_as_ids", [False, True])
@pytest.mark.parametrize("num_logprobs", [0, 3, K, -1])
def test_completion_logprobs_match_vllms(num_logprobs, tokens_as_ids):
    output, sample, prompt = _ours()
    processor = _vllm_processor(output)
    token_ids = [97, 98, 99, *output.new_token_ids]
    vllm_positions = [*processor.prompt_logprobs, *processor.logprobs]
    theirs = _serving(OpenAIServingCompletion, tokens_as_ids)._create_completion_logprobs(
        token_ids, vllm_positions, num_logprobs, ByteTokenizer(), initial_text_offset=7
    )

    strings = TokenStrings(BYTES.decode, tokens_as_ids)
    ours = completion_logprobs(token_ids, [*prompt, *sample], num_logprobs, strings, initial_text_offset=7)
    assert ours == msgspec.json.decode(theirs.model_dump_json())


@pytest.mark.parametrize("tokens_as_ids", [False, True])
@pytest.mark.parametrize("top_logprobs", [0, 2, -1])
def test_chat_logprobs_match_vllms(top_logprobs, tokens_as_ids):
    output, sample, _ = _ours()
    processor = _vllm_processor(output)
    theirs = _serving(OpenAIServingChat, tokens_as_ids)._create_chat_logprobs(
        output.new_token_ids, processor.logprobs, ByteTokenizer(), top_logprobs
    )

    ours = chat_logprobs(output.new_token_ids, sample, top_logprobs, TokenStrings(BYTES.decode, tokens_as_ids))
    assert ours == msgspec.json.decode(theirs.model_dump_json())


def test_prompt_logprobs_match_vllms():
    from vllm.entrypoints.generate.base.serving import clamp_prompt_logprobs

    output, _, prompt = _ours()
    theirs = clamp_prompt_logprobs(_vllm_processor(output).pop_prompt_logprobs())
    their_json = [
        None if p is None else {str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
                                for t, lp in p.items()}
        for p in theirs
    ]  # fmt: skip
    assert prompt_logprobs_json(prompt) == their_json
