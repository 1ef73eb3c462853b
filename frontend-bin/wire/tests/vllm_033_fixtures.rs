//! The frontend's decoder against messages encoded by vLLM 0.33.0's own engine
//! classes (tests/fixtures/vllm-0.33, written by scripts/make_vllm_fixtures.py):
//! a real vLLM engine core behind this frontend is understood.

use bytes::Bytes;
use std::fs;
use std::path::PathBuf;
use vllm_rs_wire::codec::{decode_outputs, decode_registration};
use vllm_rs_wire::protocol::{FinishReason, OutputsMessage, StopReason};

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
    let small = outputs[0].logprobs.as_deref().unwrap();
    assert_eq!((small.len(), small.width), (2, 3));
    assert_eq!(small.row(0), (&[104u32, 104, 105][..], &[-0.5f32, -0.5, -1.5][..], 1));
    assert_eq!(small.row(1), (&[101u32, 101, 102][..], &[-0.25f32, -0.25, -2.0][..], 1));
    assert!(outputs[0].prompt_logprobs.is_none());
    let big = outputs[1].prompt_logprobs.as_deref().unwrap();
    assert_eq!((big.len(), big.width), (3, 40));
    assert_eq!(big.token_ids, (0..120).collect::<Vec<u32>>());
    assert_eq!(big.logprobs[9], -9.0 / 8.0);
    assert_eq!(big.ranks, vec![2, 1, 3]);
    // Without its aux frames the message names what is missing.
    let error = decode_outputs(&first, &aux[..1]).unwrap_err().to_string();
    assert!(error.contains("new_prompt_logprobs_tensors") && error.contains("aux frame"), "{error}");
}
