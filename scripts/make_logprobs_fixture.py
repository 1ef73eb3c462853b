"""Writes tests/fixtures/vllm-0.33/outputs_logprobs.frame{0,1,2}: one
EngineCoreOutputs as vLLM 0.33's MsgpackEncoder frames it, request `small`
with LogprobsLists inline (extension 3), request `big` with LogprobsTensors
whose arrays go to aux frames. Run with vLLM's venv:
`/root/.cache/vllm033/bin/python scripts/make_logprobs_fixture.py`."""

from pathlib import Path

import numpy as np
import torch
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.outputs import LogprobsLists, LogprobsTensors
from vllm.v1.serial_utils import MsgpackEncoder

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-0.33"

ids = np.array([[104, 104, 105], [101, 101, 102]], dtype=np.int32)
lps = np.array([[-0.5, -0.5, -1.5], [-0.25, -0.25, -2.0]], dtype=np.float32)
lists = LogprobsLists(ids, lps, np.array([1, 1], dtype=np.int64), None)
big_ids = np.arange(3 * 40, dtype=np.int32).reshape(3, 40)
big_lps = -np.arange(3 * 40, dtype=np.float32).reshape(3, 40) / 8
tensors = LogprobsTensors(torch.tensor(big_ids), torch.tensor(big_lps), torch.tensor([2, 1, 3]))
outputs = EngineCoreOutputs(
    engine_index=0,
    outputs=[
        EngineCoreOutput(request_id="small", new_token_ids=[104, 101], new_logprobs=lists),
        EngineCoreOutput(request_id="big", new_token_ids=[7], new_prompt_logprobs_tensors=tensors),
    ],
)
for i, frame in enumerate(MsgpackEncoder().encode(outputs)):
    (OUT / f"outputs_logprobs.frame{i}").write_bytes(bytes(frame))
