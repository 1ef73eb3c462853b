//! The wire types against messages encoded by vLLM 0.33.0's own classes
//! (tests/fixtures/vllm-0.33, written by scripts/make_vllm_fixtures.py): a
//! real vLLM engine core behind this frontend is understood, and what the
//! frontend sends has vLLM's layout (requests slot by slot, abort and utility
//! payloads byte for byte).

use bytes::Bytes;
use serde::Serialize;
use std::fs;
use std::path::PathBuf;
use vllm_rs_wire::codec::{decode_outputs, decode_registration, encode_abort, encode_utility};
use vllm_rs_wire::protocol::{EngineCoreRequest, FinishReason, Logprobs, OutputsMessage, StopReason};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/vllm-0.33")
}

fn read(name: &str) -> Vec<u8> {
    fs::read(fixtures().join(format!("{name}.msgpack"))).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn every_outputs_message_of_vllm_decodes_as_its_kind() {
    let mut names: Vec<String> = fs::read_dir(fixtures())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("outputs_") && name.ends_with(".msgpack"))
        .map(|name| name.trim_end_matches(".msgpack").to_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 10, "{names:?}");
    for name in names {
        let bytes = read(&name);
        let message = decode_outputs(&bytes, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let kind_ok = match &message {
            OutputsMessage::Utility { .. } => name.starts_with("outputs_utility"),
            OutputsMessage::Wave { wave_complete, .. } => name == "outputs_wave_complete" && *wave_complete == Some(3),
            OutputsMessage::Batch { .. } => !name.starts_with("outputs_utility") && name != "outputs_wave_complete",
            OutputsMessage::EngineDead => false,
        };
        assert!(kind_ok, "{name}: {message:?}");
    }
}

#[test]
fn finish_reasons_stop_tokens_stats_and_finished_ids_are_read() {
    let bytes = read("outputs_finish_length");
    let OutputsMessage::Batch { engine_index, outputs, finished_requests, .. } = decode_outputs(&bytes, &[]).unwrap()
    else {
        panic!("not a batch")
    };
    assert_eq!(
        (engine_index, outputs[0].finish_reason, finished_requests),
        (1, Some(FinishReason::Length), vec!["r1"])
    );

    let bytes = read("outputs_finish_stop_token");
    let OutputsMessage::Batch { outputs, .. } = decode_outputs(&bytes, &[]).unwrap() else { panic!("not a batch") };
    assert_eq!(
        (outputs[0].finish_reason, outputs[0].stop_reason.clone()),
        (Some(FinishReason::Stop), Some(StopReason::Token(7)))
    );

    let bytes = read("outputs_request_error");
    let OutputsMessage::Batch { outputs, .. } = decode_outputs(&bytes, &[]).unwrap() else { panic!("not a batch") };
    assert_eq!(outputs[0].finish_reason, Some(FinishReason::Error));
    let error = outputs[0].error.as_ref().expect("the RequestError is decoded");
    assert_eq!(
        (error.code.as_str(), error.message.as_str(), error.retryable),
        ("validation_error", "the prompt is too long", false)
    );

    let bytes = read("outputs_first_token_events");
    let OutputsMessage::Batch { outputs, stats, .. } = decode_outputs(&bytes, &[]).unwrap() else {
        panic!("not a batch")
    };
    let stats = stats.expect("stats");
    assert_eq!((stats.num_running_reqs, stats.num_waiting_reqs), (2, 1));
    assert_eq!(outputs[0].new_token_ids.as_slice(), &[72]);

    let bytes = read("outputs_utility_failure");
    let OutputsMessage::Utility { reply, .. } = decode_outputs(&bytes, &[]).unwrap() else { panic!("not a reply") };
    assert!(reply.failure_message.unwrap().starts_with("Call to nope method failed"));

    let bytes = read("outputs_utility_result");
    let OutputsMessage::Utility { reply, .. } = decode_outputs(&bytes, &[]).unwrap() else { panic!("not a reply") };
    assert_eq!((reply.call_id, reply.result.and_then(|r| r.value)), (5, Some(rmpv::Value::Boolean(true))));
}

#[test]
fn vllms_ready_response_registers() {
    let registration = decode_registration(&read("ready_response")).unwrap();
    assert_eq!((registration.max_model_len, registration.num_gpu_blocks), (Some(2048), Some(512)));
    assert_eq!(registration.dp_stats_address, None);
}

/// One EngineCoreOutputs framed by vLLM 0.33's own MsgpackEncoder
/// (scripts/make_logprobs_fixture.py): `small` has LogprobsLists inline
/// (extension 3), `big` LogprobsTensors with two arrays in aux frames.
fn vllm_logprobs_frames() -> (Vec<u8>, Vec<Bytes>) {
    let read = |i: usize| fs::read(fixtures().join(format!("outputs_logprobs.frame{i}"))).expect("fixture");
    (read(0), vec![Bytes::from(read(1)), Bytes::from(read(2))])
}

#[test]
fn logprobs_from_vllm_inline_and_in_aux_frames() {
    let (first, aux) = vllm_logprobs_frames();
    let OutputsMessage::Batch { outputs, .. } = decode_outputs(&first, &aux).unwrap() else { panic!() };
    let small = outputs[0].new_logprobs.as_ref().and_then(Logprobs::rows).unwrap();
    assert_eq!((small.len(), small.width), (2, 3));
    assert_eq!(small.row(0), (&[104u32, 104, 105][..], &[-0.5f32, -0.5, -1.5][..], 1));
    assert_eq!(small.row(1), (&[101u32, 101, 102][..], &[-0.25f32, -0.25, -2.0][..], 1));
    assert!(outputs[0].new_prompt_logprobs_tensors.is_none());
    let big = outputs[1].new_prompt_logprobs_tensors.as_ref().and_then(Logprobs::rows).unwrap();
    assert_eq!((big.len(), big.width), (3, 40));
    assert_eq!(big.token_ids, (0..120).collect::<Vec<u32>>());
    assert_eq!(big.logprobs[9], -9.0 / 8.0);
    assert_eq!(big.ranks, vec![2, 1, 3]);
    // Without its aux frames the message names what is missing.
    let error = decode_outputs(&first, &aux[..1]).unwrap_err().to_string();
    assert!(error.contains("new_prompt_logprobs_tensors") && error.contains("aux frame"), "{error}");
}

/// The msgpack value of `bytes` (one value, nothing after it).
fn value(bytes: &[u8]) -> rmpv::Value {
    let mut rest = bytes;
    let value = rmpv::decode::read_value(&mut rest).unwrap();
    assert!(rest.is_empty());
    value
}

/// Sampling keys vLLM writes that this frontend does not model: it never
/// sends them, and vLLM's defaults for them are what the frontend means.
const UNMODELLED_SAMPLING_KEYS: [&str; 7] = [
    "stop",
    "bad_words",
    "skip_reading_prefix_cache",
    "logit_bias",
    "output_text_buffer_length",
    "output_kind",
    "skip_clone",
];

#[test]
fn vllms_requests_read_as_engine_core_request_and_encode_back_to_the_same_slots() {
    let mut names: Vec<String> = fs::read_dir(fixtures())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| (name.starts_with("request_") || name.starts_with("genconfig_")) && name.ends_with(".msgpack"))
        .collect();
    names.sort();
    assert!(names.len() >= 20, "{names:?}");
    for name in names {
        let bytes = fs::read(fixtures().join(&name)).unwrap();
        let request: EngineCoreRequest = rmp_serde::from_slice(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut ours = Vec::new();
        request.serialize(&mut rmp_serde::Serializer::new(&mut ours).with_struct_map()).unwrap();
        let (rmpv::Value::Array(theirs), rmpv::Value::Array(ours)) = (value(&bytes), value(&ours)) else {
            panic!("{name}: not arrays")
        };
        assert_eq!(ours.len(), theirs.len(), "{name}: every slot of vLLM 0.33's EngineCoreRequest");
        for (slot, (ours, theirs)) in ours.iter().zip(&theirs).enumerate() {
            if slot != 3 {
                assert_eq!(ours, theirs, "{name}: slot {slot}");
                continue;
            }
            // sampling_params: each key we send has vLLM's value; the keys
            // vLLM sent that we do not are unmodelled, or nil (an explicit
            // `max_tokens: None`, which this frontend never sends).
            let (ours, theirs) = (ours.as_map().unwrap(), theirs.as_map().unwrap());
            let get = |map: &[(rmpv::Value, rmpv::Value)], key: &str| {
                map.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v.clone())
            };
            for (key, value) in ours {
                assert_eq!(Some(value.clone()), get(theirs, key.as_str().unwrap()), "{name}: {key}");
            }
            for (key, value) in theirs {
                let key = key.as_str().unwrap();
                assert!(
                    get(ours, key).is_some() || UNMODELLED_SAMPLING_KEYS.contains(&key) || value.is_nil(),
                    "{name}: vLLM's sampling key {key} = {value} is lost"
                );
            }
        }
    }
}

#[test]
fn abort_and_utility_payloads_are_vllms_bytes() {
    assert_eq!(encode_abort(&["r1", "r2"]), read("abort"));
    for name in [
        "utility_get_supported_tasks",
        "utility_is_sleeping",
        "utility_reset_prefix_cache",
        "utility_sleep",
        "utility_sleep_level0_keep",
        "utility_wake_up",
        "utility_wake_up_tags",
    ] {
        let bytes = read(name);
        let rmpv::Value::Array(call) = value(&bytes) else { panic!("{name}: not an array") };
        let [client, call_id, method, rmpv::Value::Array(args)] = &call[..] else { panic!("{name}: {call:?}") };
        let encoded =
            encode_utility(client.as_u64().unwrap() as u32, call_id.as_i64().unwrap(), method.as_str().unwrap(), args);
        assert_eq!(encoded, bytes, "{name}");
    }
}
