"""Property tests (hypothesis, bounded to run in seconds) for the Python API
server's engine-output MessagePack decoder: arbitrary bytes and mutated valid
messages raise nothing but EngineOutputError. (Request parsing is fuzzed over
HTTP against both frontends in tests/conformance/test_http_fuzz.py.)"""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_rs.api_server.engine_outputs import EngineOutputError, decode_engine_message
from vllm_rs.engine.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
    UtilityOutput,
    encode_outputs,
)

QUICK = settings(max_examples=150, deadline=None, database=None)

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=12,
)

outputs = st.builds(
    EngineCoreOutput,
    request_id=st.text(min_size=1, max_size=8),
    new_token_ids=st.lists(st.integers(0, 2**32 - 1), max_size=4),
    finish_reason=st.none() | st.sampled_from(FinishReason),
    stop_reason=st.none() | st.integers(0, 300) | st.text(max_size=4),
)
batches = st.builds(
    EngineCoreOutputs,
    engine_index=st.integers(0, 3),
    outputs=st.lists(outputs, min_size=1, max_size=3),
    scheduler_stats=st.none()
    | st.fixed_dictionaries({"num_running_reqs": st.integers(0, 9), "num_waiting_reqs": st.integers(0, 9)}),
    timestamp=st.floats(1, 2e9),
)
utility_replies = st.builds(
    EngineCoreOutputs,
    engine_index=st.integers(0, 3),
    utility_output=st.builds(
        UtilityOutput, call_id=st.integers(0, 2**31), failure_message=st.none() | st.text(max_size=8)
    ),
    timestamp=st.floats(1, 2e9),
)
valid_messages = batches | utility_replies


def decodes_or_refuses(data: bytes) -> None:
    try:
        decode_engine_message([data])
    except EngineOutputError:
        pass


@QUICK
@given(st.binary(max_size=256))
def test_arbitrary_bytes_never_raise_anything_but_the_decoders_error(data):
    decodes_or_refuses(data)


@QUICK
@given(valid_messages)
def test_valid_messages_decode_to_what_was_sent(message):
    decoded = decode_engine_message([encode_outputs(message)])
    assert decoded.engine_index == message.engine_index
    sent = [(o.request_id, o.new_token_ids, o.finish_reason) for o in message.outputs]
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in decoded.outputs] == sent
    if message.utility_output is not None:
        assert decoded.utility_output.call_id == message.utility_output.call_id
        assert decoded.utility_output.failure_message == message.utility_output.failure_message


@QUICK
@given(valid_messages, st.data())
def test_byte_mutations_of_valid_messages_never_raise_anything_but_the_decoders_error(message, data):
    raw = bytearray(encode_outputs(message))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if action == "flip":
            raw[at] ^= data.draw(st.integers(1, 255))
        elif action == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif len(raw) > 1:
            del raw[at]
    decodes_or_refuses(bytes(raw))


def _replace_somewhere(value, replacement, path):
    """`value` with the node at `path` (indices into nested lists) replaced."""
    if not path or not isinstance(value, list) or not value:
        return replacement
    index = path[0] % len(value)
    return [*value[:index], _replace_somewhere(value[index], replacement, path[1:]), *value[index + 1 :]]


@QUICK
@given(valid_messages, msgpack_values, st.lists(st.integers(0, 10), max_size=4))
def test_structural_mutations_of_valid_messages_never_raise_anything_but_the_decoders_error(message, replacement, path):
    mutated = _replace_somewhere(message.to_wire(), replacement, path)
    decodes_or_refuses(msgpack.packb(mutated, use_bin_type=True))
