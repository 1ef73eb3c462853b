//! The payloads' MessagePack encoding and decoding, through the serde derives
//! of their types (`protocol`): frontend-to-engine payloads are encoded,
//! output-socket messages and registrations decoded and checked.

use super::protocol::{
    EngineCoreOutputs, EngineCoreRequest, EngineRequest, LaterSlotsSkipped, OutputsMessage, Registration, UtilityCall,
    ENGINE_CORE_DEAD,
};
use bytes::Bytes;
use rmpv::Value;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

/// Why an outputs message could not be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    /// Not the expected msgpack shape.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// Well-formed but against the protocol (empty, or a mix of kinds).
    #[error("protocol error: {0}")]
    Protocol(String),
}

fn malformed(what: impl Into<String>) -> DecodeError {
    DecodeError::Malformed(what.into())
}

/// `value` as msgpack: vLLM's array_like structs as arrays (their
/// `Serialize_tuple` derive), every other struct as a map keyed by field name.
fn encode<T: Serialize>(value: &T, capacity: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(capacity);
    // Writing into a Vec cannot fail, and every payload type serializes.
    value.serialize(&mut rmp_serde::Serializer::new(&mut buf).with_struct_map()).expect("encode into a Vec");
    buf
}

/// Encodes an ADD payload (an `EngineCoreRequest`) for request wave
/// `current_wave` (the coordinator's; 0 without one).
pub fn encode_add(req: &EngineRequest, current_wave: u64) -> Vec<u8> {
    encode(&EngineCoreRequest::new(req, current_wave), 160 + 2 * req.prompt_token_ids.len())
}

/// Encodes an ABORT payload: the array of request ids.
pub fn encode_abort<S: AsRef<str>>(request_ids: &[S]) -> Vec<u8> {
    let ids: Vec<&str> = request_ids.iter().map(AsRef::as_ref).collect();
    encode(&ids, 16 + 24 * ids.len())
}

/// Encodes a UTILITY payload: `[client_index, call_id, method_name, args]`.
pub fn encode_utility(client_index: u32, call_id: i64, method: &str, args: &[Value]) -> Vec<u8> {
    encode(&UtilityCall { client_index, call_id, method, args }, 32 + method.len())
}

/// Decodes the one msgpack value `frame` holds as a `T` (strings borrowed
/// from it), refusing trailing bytes.
fn from_frame<'a, T: Deserialize<'a>>(frame: &'a [u8], what: &str) -> Result<T, DecodeError> {
    let mut de = rmp_serde::Deserializer::from_read_ref(frame);
    let value = T::deserialize(&mut de).map_err(|e| malformed(format!("{what}: {e}")))?;
    // The frame is used up exactly when reading one more marker finds its end.
    match IgnoredAny::deserialize(&mut de) {
        Err(rmp_serde::decode::Error::InvalidMarkerRead(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Ok(value)
        }
        _ => Err(malformed(format!("{what}: trailing bytes after the message"))),
    }
}

/// Decodes one message from the output socket: its frames are
/// `[EngineCoreOutputs, aux frames...]` or the single frame `ENGINE_CORE_DEAD`.
/// Strings in the result borrow from `frame` (the first frame); `aux` are
/// the frames after it, which hold large logprobs arrays (resolved here).
pub fn decode_outputs<'a>(frame: &'a [u8], aux: &'a [Bytes]) -> Result<OutputsMessage<'a>, DecodeError> {
    if frame == ENGINE_CORE_DEAD {
        return Ok(OutputsMessage::EngineDead);
    }
    let LaterSlotsSkipped(mut message): LaterSlotsSkipped<EngineCoreOutputs<'a>> =
        from_frame(frame, "EngineCoreOutputs")?;
    for output in &mut message.outputs {
        for (logprobs, what) in [
            (&mut output.new_logprobs, "new_logprobs"),
            (&mut output.new_prompt_logprobs_tensors, "new_prompt_logprobs_tensors"),
        ] {
            if let Some(logprobs) = logprobs {
                logprobs.resolve(aux, what).map_err(|e| malformed(e.to_string()))?;
            }
        }
        if let Some(pooled) = &mut output.pooling_output {
            pooled.resolve(aux, "pooling_output").map_err(|e| malformed(e.to_string()))?;
        }
    }
    classify(message)
}

/// The kind of a decoded message: exactly one of a batch, a utility reply or a wave message.
fn classify(message: EngineCoreOutputs<'_>) -> Result<OutputsMessage<'_>, DecodeError> {
    let EngineCoreOutputs {
        engine_index,
        outputs,
        scheduler_stats,
        timestamp,
        utility_output,
        finished_requests,
        wave_complete,
        start_wave,
        ..
    } = message;
    let finished_requests = finished_requests.unwrap_or_default();
    let is_batch = !outputs.is_empty() || scheduler_stats.is_some() || !finished_requests.is_empty();
    let is_wave = wave_complete.is_some() || start_wave.is_some();
    match (is_batch, utility_output, is_wave) {
        (true, None, false) => {
            Ok(OutputsMessage::Batch { engine_index, outputs, timestamp, stats: scheduler_stats, finished_requests })
        }
        (false, Some(reply), false) => Ok(OutputsMessage::Utility { engine_index, reply }),
        (false, None, true) => Ok(OutputsMessage::Wave { engine_index, wave_complete, start_wave }),
        (false, None, false) => Err(DecodeError::Protocol(format!("empty outputs message from engine {engine_index}"))),
        _ => Err(DecodeError::Protocol(format!(
            "outputs message from engine {engine_index} mixes request outputs, a utility reply and wave fields"
        ))),
    }
}

/// Decodes one complete msgpack value, rejecting trailing bytes.
fn read_value(bytes: &[u8]) -> Result<Value, DecodeError> {
    from_frame(bytes, "registration")
}

/// Why a registration payload was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RegistrationError {
    /// Not one msgpack value.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A msgpack value other than a map.
    #[error("expected an empty payload or a map, got {0}")]
    NotAMap(Value),
    /// A required key is absent.
    #[error("registration map lacks `{0}`")]
    Missing(&'static str),
    /// A count that is not a non-negative integer.
    #[error("registration `{key}` must be a non-negative integer, got {value}")]
    NotACount {
        /// The key.
        key: &'static str,
        /// What it held.
        value: Value,
    },
    /// `dp_stats_address` that is not a string.
    #[error("registration `dp_stats_address` must be a string, got {0}")]
    AddressNotAString(Value),
}

/// Decodes a registration payload: empty, or a map with `max_model_len` and
/// `num_gpu_blocks` (both required) and optionally `dp_stats_address`.
pub fn decode_registration(payload: &[u8]) -> Result<Registration, RegistrationError> {
    if payload.is_empty() {
        return Ok(Registration::default());
    }
    let value = read_value(payload)?;
    let Value::Map(map) = value else { return Err(RegistrationError::NotAMap(value)) };
    let get = |key: &str| map.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v);
    let required_count = |key: &'static str| -> Result<u64, RegistrationError> {
        let value = get(key).ok_or(RegistrationError::Missing(key))?;
        value.as_u64().ok_or_else(|| RegistrationError::NotACount { key, value: value.clone() })
    };
    let dp_stats_address = match get("dp_stats_address") {
        None | Some(Value::Nil) => None,
        Some(v) => Some(v.as_str().ok_or_else(|| RegistrationError::AddressNotAString(v.clone()))?.to_owned()),
    };
    Ok(Registration {
        max_model_len: Some(required_count("max_model_len")?),
        num_gpu_blocks: Some(required_count("num_gpu_blocks")?),
        dp_stats_address,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{
        EngineEventKind, FinishReason, Logprobs, Pooled, PoolingParams, PrefillStats, PrefixCacheStats, SamplingParams,
        SchedulerStats, StopReason, Unused, UtilityOutput, UtilityResult,
    };

    /// `b"ab"` as a msgpack fixstr.
    fn fixstr(s: &str) -> Vec<u8> {
        let mut v = vec![0xa0 | s.len() as u8];
        v.extend_from_slice(s.as_bytes());
        v
    }

    fn cat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn add_request_matches_hand_written_bytes() {
        let req = EngineRequest {
            request_id: "r-1".into(),
            prompt_token_ids: vec![1, 300],
            sampling: SamplingParams { max_tokens: Some(5), temperature: Some(0.5), ..Default::default() },
            arrival_time: 2.0,
            data_parallel_rank: Some(1),
            client_index: 0,
            external_request_id: "x".into(),
            pooling: None,
        };
        let expected = cat(&[
            &[0xdc, 0x00, 0x16], // array16 of 22
            &fixstr("r-1"),
            &[0x92, 0x01, 0xcd, 0x01, 0x2c], // [1, 300]
            &[0xc0],                         // mm_features
            &[0x84],                         // map of 4, in vLLM's field order
            &fixstr("temperature"),
            &[0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0], // 0.5
            &fixstr("stop_token_ids"),
            &[0x90],
            &fixstr("max_tokens"),
            &[0x05],
            &fixstr("_all_stop_token_ids"),
            &[0x90],
            &[0xc0],                               // pooling_params
            &[0xcb, 0x40, 0x00, 0, 0, 0, 0, 0, 0], // arrival_time 2.0
            &[0xc0, 0xc0],                         // lora_request, cache_salt
            &[0x01],                               // data_parallel_rank
            &[0xc0, 0xc0],                         // prompt_embeds, prompt_is_token_ids
            &[0x00, 0x00, 0x00],                   // client_index, current_wave, priority
            &[0xc0, 0xc2],                         // trace_headers, resumable
            &fixstr("x"),
            &[0xc0, 0xc0, 0xc2, 0xc0, 0xc0], // reasoning_ended .. kv_hints
        ]);
        assert_eq!(encode_add(&req, 0), expected);
    }

    #[test]
    fn sampling_params_include_seed_eos_and_ignore_eos_when_set() {
        let p = SamplingParams {
            seed: Some(-1),
            eos_token_id: Some(256),
            ignore_eos: true,
            stop_token_ids: vec![7],
            all_stop_token_ids: vec![7, 256],
            ..Default::default()
        };
        let expected = cat(&[
            &[0x85],
            &fixstr("seed"),
            &[0xff],
            &fixstr("stop_token_ids"),
            &[0x91, 0x07],
            &fixstr("ignore_eos"),
            &[0xc3],
            &fixstr("_eos_token_id"),
            &[0xcd, 0x01, 0x00],
            &fixstr("_all_stop_token_ids"),
            &[0x92, 0x07, 0xcd, 0x01, 0x00],
        ]);
        assert_eq!(encode(&p, 0), expected);
    }

    #[test]
    fn abort_and_utility_match_hand_written_bytes() {
        assert_eq!(encode_abort(&["a", "bc"]), cat(&[&[0x92], &fixstr("a"), &fixstr("bc")]));
        assert_eq!(
            encode_utility(0, 7, "get_stats", &[Value::from(1)]),
            cat(&[&[0x94, 0x00, 0x07], &fixstr("get_stats"), &[0x91, 0x01]])
        );
    }

    #[test]
    fn short_outputs_take_defaults() {
        // [0, [["r1", [65, 66]]]]
        let bytes = cat(&[&[0x92, 0x00, 0x91, 0x92], &fixstr("r1"), &[0x92, 0x41, 0x42]]);
        let OutputsMessage::Batch { engine_index, outputs, timestamp, stats, finished_requests } =
            decode_outputs(&bytes, &[]).unwrap()
        else {
            panic!("expected a batch")
        };
        assert_eq!((engine_index, timestamp, stats, finished_requests), (0, 0.0, None, vec![]));
        let output = &outputs[0];
        assert_eq!((output.request_id, output.new_token_ids.as_slice()), ("r1", &[65, 66][..]));
        assert_eq!((output.new_logprobs.is_none(), output.new_prompt_logprobs_tensors.is_none()), (true, true));
        assert_eq!((output.finish_reason, &output.stop_reason, &output.error), (None, &None, &None));
        assert_eq!((output.events.is_empty(), output.prefill_stats, output.num_nans_in_logits), (true, None, 0));
    }

    #[test]
    fn full_output_with_finish_stats_and_finished_ids() {
        // [1, [["r", [1], nil, nil, nil, 0, 9, nil]], {"num_running_reqs": 2, "num_waiting_reqs": 3}, 1.5, nil, ["r"]]
        let bytes = cat(&[
            &[0x96, 0x01, 0x91, 0x98],
            &fixstr("r"),
            &[0x91, 0x01, 0xc0, 0xc0, 0xc0, 0x00, 0x09, 0xc0],
            &[0x82],
            &fixstr("num_running_reqs"),
            &[0x02],
            &fixstr("num_waiting_reqs"),
            &[0x03],
            &[0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0],
            &[0xc0, 0x91],
            &fixstr("r"),
        ]);
        let OutputsMessage::Batch { engine_index, outputs, timestamp, stats, finished_requests } =
            decode_outputs(&bytes, &[]).unwrap()
        else {
            panic!("expected a batch")
        };
        assert_eq!(engine_index, 1);
        assert_eq!(outputs[0].finish_reason, Some(FinishReason::Stop));
        assert_eq!(outputs[0].stop_reason, Some(StopReason::Token(9)));
        assert_eq!(stats, Some(SchedulerStats { num_running_reqs: 2, num_waiting_reqs: 3, ..Default::default() }));
        assert_eq!((timestamp, finished_requests), (1.5, vec!["r"]));
    }

    #[test]
    fn slots_a_newer_vllm_appends_are_skipped() {
        // 19 known slots of an output plus 2 more (a map and a string), in
        // 9 known slots of the message plus 1 more; then a utility reply with
        // a 4th slot. Every known slot still reads as sent.
        let mut output = vec![Value::from("r"), Value::from(vec![Value::from(7)])];
        output.extend(std::iter::repeat_n(Value::Nil, 3));
        output.push(Value::from(0)); // finish_reason: stop
        output.push(Value::from(9)); // stop_reason: token 9
        output.extend(std::iter::repeat_n(Value::Nil, 11));
        output.push(Value::Nil); // error
        assert_eq!(output.len(), 19);
        output.push(Value::Map(vec![(Value::from("k"), Value::from(1))]));
        output.push(Value::from("later"));
        let mut message = vec![Value::from(2), Value::from(vec![Value::Array(output)])];
        message.extend([Value::Nil, Value::from(1.5), Value::Nil, Value::from(vec![Value::from("r")])]);
        message.extend([Value::Nil, Value::Nil, Value::Nil, Value::from("a tenth slot")]);
        let bytes = rmp_serde::to_vec(&Value::Array(message)).unwrap();
        let OutputsMessage::Batch { engine_index, outputs, timestamp, finished_requests, .. } =
            decode_outputs(&bytes, &[]).unwrap()
        else {
            panic!("expected a batch")
        };
        assert_eq!((engine_index, timestamp, finished_requests), (2, 1.5, vec!["r"]));
        assert_eq!((outputs[0].request_id, outputs[0].new_token_ids.as_slice()), ("r", &[7][..]));
        assert_eq!(
            (outputs[0].finish_reason, &outputs[0].stop_reason),
            (Some(FinishReason::Stop), &Some(StopReason::Token(9)))
        );

        let reply = vec![Value::from(4), Value::Nil, Value::Nil, Value::from("later")];
        let message = vec![Value::from(0), Value::Nil, Value::Nil, Value::Nil, Value::Array(reply)];
        let bytes = rmp_serde::to_vec(&Value::Array(message)).unwrap();
        let OutputsMessage::Utility { reply, .. } = decode_outputs(&bytes, &[]).unwrap() else {
            panic!("expected a utility reply")
        };
        assert_eq!((reply.call_id, reply.failure_message), (4, None));
    }

    #[test]
    fn a_request_error_after_nil_slots_is_decoded() {
        // As the mock engine and older engines send it: every slot up to the
        // RequestError nil, the NaN count included; finish reason ERROR.
        let mut output: Vec<Value> = vec![Value::from("r"), Value::Array(vec![])];
        output.extend([Value::Nil, Value::Nil, Value::Nil, Value::from(3)]);
        output.extend(std::iter::repeat_n(Value::Nil, 12));
        output.push(Value::Map(vec![
            (Value::from("code"), Value::from("validation_error")),
            (Value::from("message"), Value::from("bad")),
            (Value::from("retryable"), Value::from(false)),
        ]));
        let message = Value::Array(vec![Value::from(0), Value::Array(vec![Value::Array(output)])]);
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &message).unwrap();
        let OutputsMessage::Batch { outputs, .. } = decode_outputs(&bytes, &[]).unwrap() else {
            panic!("expected a batch")
        };
        assert_eq!((outputs[0].finish_reason, outputs[0].num_nans_in_logits), (Some(FinishReason::Error), 0));
        let error = outputs[0].error.as_ref().expect("the request error");
        assert_eq!((error.code.as_str(), error.message.as_str(), error.retryable), ("validation_error", "bad", false));
    }

    #[test]
    fn events_prefill_stats_and_scheduler_stats_are_decoded() {
        let event = |kind: i64, at: f64| {
            Value::Map(vec![(Value::from("type"), Value::from(kind)), (Value::from("timestamp"), Value::F64(at))])
        };
        let mut output: Vec<Value> = vec![Value::from("r"), Value::Array(vec![Value::from(7)])];
        output.extend([Value::Nil, Value::Nil, Value::Nil, Value::Nil, Value::Nil]);
        // QUEUED, SCHEDULED, an unknown kind (skipped), PREEMPTED.
        output.push(Value::Array(vec![event(1, 1.0), event(2, 1.25), event(9, 1.3), event(3, 1.5)]));
        output.extend([Value::Nil, Value::Nil, Value::Nil]);
        // PrefillStats as an array (msgspec's array_like) in slot 11, then 2 NaNs in slot 13.
        output.push(Value::Array([40, 24, 16, 16, 0].map(Value::from).to_vec()));
        output.extend([Value::Nil, Value::from(2)]);
        let stats = Value::Map(vec![
            (Value::from("num_running_reqs"), Value::from(1)),
            (Value::from("num_waiting_reqs"), Value::from(3)),
            (Value::from("num_skipped_waiting_reqs"), Value::from(1)),
            (Value::from("kv_cache_usage"), Value::F32(0.5)),
            (
                Value::from("prefix_cache_stats"),
                Value::Map(vec![
                    (Value::from("reset"), Value::from(false)),
                    (Value::from("queries"), Value::from(48)),
                    (Value::from("hits"), Value::from(32)),
                    (Value::from("hits_by_source"), Value::Map(vec![])),
                ]),
            ),
        ]);
        let message =
            Value::Array(vec![Value::from(0), Value::Array(vec![Value::Array(output)]), stats, Value::from(2)]);
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &message).unwrap();
        let OutputsMessage::Batch { outputs, timestamp, stats, .. } = decode_outputs(&bytes, &[]).unwrap() else {
            panic!("expected a batch")
        };
        let kinds: Vec<_> = outputs[0].events.iter().map(|e| (e.kind, e.timestamp)).collect();
        assert_eq!(
            kinds,
            [(EngineEventKind::Queued, 1.0), (EngineEventKind::Scheduled, 1.25), (EngineEventKind::Preempted, 1.5)]
        );
        let prefill = PrefillStats {
            num_prompt_tokens: 40,
            num_computed_tokens: 24,
            num_cached_tokens: 16,
            num_local_cached_tokens: 16,
            num_external_cached_tokens: 0,
        };
        assert_eq!((outputs[0].prefill_stats, outputs[0].num_nans_in_logits), (Some(prefill), 2));
        assert_eq!(timestamp, 2.0);
        let expected = SchedulerStats {
            num_running_reqs: 1,
            num_waiting_reqs: 3,
            num_skipped_waiting_reqs: 1,
            kv_cache_usage: 0.5,
            prefix_cache_stats: PrefixCacheStats { queries: 48, hits: 32 },
        };
        assert_eq!(stats, Some(expected));
    }

    #[test]
    fn stop_string_reason_and_length_finish() {
        let bytes = cat(&[&[0x92, 0x00, 0x91, 0x97], &fixstr("r"), &[0x90, 0xc0, 0xc0, 0xc0, 0x01], &fixstr("END")]);
        let OutputsMessage::Batch { outputs, .. } = decode_outputs(&bytes, &[]).unwrap() else { panic!() };
        assert_eq!(outputs[0].finish_reason, Some(FinishReason::Length));
        assert_eq!(outputs[0].stop_reason, Some(StopReason::Text("END".into())));
    }

    #[test]
    fn utility_reply_is_decoded() {
        // [0, [], nil, 0.0, [5, nil, [nil, "ok"]]]
        let bytes = cat(&[
            &[0x95, 0x00, 0x90, 0xc0, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x93, 0x05, 0xc0, 0x92, 0xc0],
            &fixstr("ok"),
        ]);
        let msg = decode_outputs(&bytes, &[]).unwrap();
        let result = UtilityResult { type_info: Unused, value: Some(Value::from("ok")) };
        let reply = UtilityOutput { call_id: 5, failure_message: None, result: Some(result) };
        assert_eq!(msg, OutputsMessage::Utility { engine_index: 0, reply });
        // failure: [0, nil, nil, nil, [6, "boom"]]
        let bytes = cat(&[&[0x95, 0x00, 0xc0, 0xc0, 0xc0, 0x92, 0x06], &fixstr("boom")]);
        let OutputsMessage::Utility { reply, .. } = decode_outputs(&bytes, &[]).unwrap() else { panic!() };
        assert_eq!(reply.failure_message.as_deref(), Some("boom"));
    }

    #[test]
    fn wave_message_is_decoded() {
        // [0, [], nil, 0, nil, nil, 3]
        let bytes = vec![0x97, 0x00, 0x90, 0xc0, 0x00, 0xc0, 0xc0, 0x03];
        assert_eq!(
            decode_outputs(&bytes, &[]).unwrap(),
            OutputsMessage::Wave { engine_index: 0, wave_complete: Some(3), start_wave: None }
        );
    }

    #[test]
    fn logprobs_that_break_the_layout_are_malformed() {
        fn message(rows: Value) -> Vec<u8> {
            let output = Value::Array(vec![Value::from("r"), Value::Array(vec![Value::from(1)]), rows]);
            let mut bytes = Vec::new();
            rmpv::encode::write_value(&mut bytes, &Value::Array(vec![Value::from(0), Value::Array(vec![output])]))
                .unwrap();
            bytes
        }
        let array = |dtype: &str, shape: &[u64], data: Vec<u8>| {
            Value::Array(vec![
                Value::from(dtype),
                Value::Array(shape.iter().map(|&d| Value::from(d)).collect()),
                Value::Ext(3, data),
            ])
        };
        let good = || {
            vec![
                array("<i4", &[1, 2], [5i32, 6].iter().flat_map(|v| v.to_le_bytes()).collect()),
                array("<f4", &[1, 2], [-1f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect()),
                array("<i8", &[1], 1i64.to_le_bytes().to_vec()),
                Value::Nil,
            ]
        };
        let bytes = message(Value::Array(good()));
        let OutputsMessage::Batch { outputs, .. } = decode_outputs(&bytes, &[]).unwrap() else { panic!() };
        assert_eq!(
            outputs[0].new_logprobs.as_ref().and_then(Logprobs::rows).unwrap().row(0),
            (&[5u32, 6][..], &[-1f32, -2.0][..], 1)
        );
        let mut wrong_dtype = good();
        wrong_dtype[1] = array("<f8", &[1, 2], vec![0; 16]);
        let mut short_data = good();
        short_data[0] = array("<i4", &[1, 2], vec![0; 7]);
        let mut negative_id = good();
        negative_id[0] = array("<i4", &[1, 2], [-5i32, 6].iter().flat_map(|v| v.to_le_bytes()).collect());
        let mut ranks_shape = good();
        ranks_shape[2] = array("<i8", &[2], vec![0; 16]);
        let mut other_ext = good();
        other_ext[2] =
            Value::Array(vec![Value::from("<i8"), Value::Array(vec![Value::from(1)]), Value::Ext(4, vec![0; 8])]);
        for rows in [wrong_dtype, short_data, negative_id, ranks_shape, other_ext, good()[..2].to_vec()] {
            let bytes = message(Value::Array(rows));
            assert!(matches!(decode_outputs(&bytes, &[]), Err(DecodeError::Malformed(_))), "{bytes:x?}");
        }
    }

    #[test]
    fn a_pooling_request_sends_pooling_params_and_no_sampling_params() {
        let pooling = PoolingParams {
            task: Some("classify".into()),
            use_activation: Some(false),
            extra_kwargs: Some([("compressed_token_type_ids".to_string(), 4)].into()),
            ..PoolingParams::default()
        };
        let req = EngineRequest {
            request_id: "p".into(),
            prompt_token_ids: vec![1],
            sampling: SamplingParams::default(),
            arrival_time: 0.0,
            data_parallel_rank: None,
            client_index: 0,
            external_request_id: "p".into(),
            pooling: Some(pooling),
        };
        let Value::Array(slots) = rmpv::decode::read_value(&mut &encode_add(&req, 0)[..]).unwrap() else { panic!() };
        assert_eq!(slots[3], Value::Nil);
        let Value::Array(params) = &slots[4] else { panic!("pooling_params is {}", slots[4]) };
        // vLLM 0.33's slot order: use_activation (0), dimensions (1), ..., task (4),
        // ..., extra_kwargs (8), output_kind (9, FINAL_ONLY), late_chunking_params (10).
        assert_eq!(params.len(), 11);
        assert_eq!((&params[0], &params[4]), (&Value::Boolean(false), &Value::from("classify")));
        assert_eq!(params[8], Value::Map(vec![(Value::from("compressed_token_type_ids"), Value::from(4))]));
        assert_eq!((&params[9], &params[10]), (&Value::from(2), &Value::Nil));
    }

    #[test]
    fn pooling_output_is_read_inline_or_from_an_aux_frame() {
        let values = [0.5f32, -1.25, 3.0];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let message = |data: Value, dtype: &str| {
            let tensor = Value::Array(vec![Value::from(dtype), Value::Array(vec![Value::from(3)]), data]);
            let output = Value::Array(vec![
                Value::from("r"),
                Value::Array(vec![]),
                Value::Nil,
                Value::Nil,
                tensor,
                Value::from(0),
            ]);
            let mut out = Vec::new();
            rmpv::encode::write_value(&mut out, &Value::Array(vec![Value::from(0), Value::Array(vec![output])]))
                .unwrap();
            out
        };
        let aux = [Bytes::from(bytes.clone())];
        for (frame, aux) in [
            (message(Value::Ext(3, bytes.clone()), "float32"), &[][..]),
            (message(Value::from(1), "float32"), &aux[..]),
        ] {
            let OutputsMessage::Batch { outputs, .. } = decode_outputs(&frame, aux).unwrap() else { panic!() };
            let output = outputs.into_iter().next().unwrap();
            assert_eq!(output.finish_reason, Some(FinishReason::Stop));
            assert_eq!(output.pooling_output.and_then(Pooled::into_values), Some(values.to_vec()));
        }
        let bad = message(Value::Ext(3, bytes[..8].to_vec()), "float32");
        assert!(matches!(decode_outputs(&bad, &[]), Err(DecodeError::Malformed(_))));
        let ints = message(Value::Ext(3, bytes), "int32");
        assert!(matches!(decode_outputs(&ints, &[]), Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn engine_dead_frame() {
        assert_eq!(decode_outputs(b"ENGINE_CORE_DEAD", &[]).unwrap(), OutputsMessage::EngineDead);
    }

    #[test]
    fn empty_and_mixed_messages_are_protocol_errors() {
        assert!(matches!(decode_outputs(&[0x91, 0x00], &[]), Err(DecodeError::Protocol(_))));
        // outputs plus a wave_complete
        let bytes = cat(&[&[0x97, 0x00, 0x91, 0x92], &fixstr("r"), &[0x90, 0xc0, 0xc0, 0xc0, 0xc0, 0x01]]);
        assert!(matches!(decode_outputs(&bytes, &[]), Err(DecodeError::Protocol(_))));
    }

    #[test]
    fn malformed_messages_are_reported_not_panicked() {
        for bytes in [
            vec![],                                                                           // nothing
            vec![0xc1],                                                                       // reserved byte
            vec![0x92, 0x00],                                                                 // truncated
            vec![0xa1, b'x'],                                                                 // not an array
            vec![0x92, 0x00, 0x91, 0x91, 0x01], // output too short, id not a string
            vec![0x92, 0x00, 0x91, 0x92, 0xa1, b'r', 0x91, 0xff], // negative token id
            cat(&[&[0x92, 0x00, 0x91, 0x96], &fixstr("r"), &[0x90, 0xc0, 0xc0, 0xc0, 0x09]]), // unknown finish
            vec![0x91, 0x00, 0x00],             // trailing byte
        ] {
            assert!(matches!(decode_outputs(&bytes, &[]), Err(DecodeError::Malformed(_))), "{bytes:x?}");
        }
    }

    #[test]
    fn registration_payloads() {
        assert_eq!(decode_registration(b"").unwrap(), Registration::default());
        let map = cat(&[
            &[0x83],
            &fixstr("max_model_len"),
            &[0xcd, 0x08, 0x00],
            &fixstr("num_gpu_blocks"),
            &[0x10],
            &fixstr("dp_stats_address"),
            &[0xc0],
        ]);
        let r = decode_registration(&map).unwrap();
        assert_eq!((r.max_model_len, r.num_gpu_blocks, r.dp_stats_address), (Some(2048), Some(16), None));
        let missing = cat(&[&[0x81], &fixstr("max_model_len"), &[0x10]]);
        assert_eq!(decode_registration(&missing), Err(RegistrationError::Missing("num_gpu_blocks")));
        assert!(decode_registration(&missing).unwrap_err().to_string().contains("num_gpu_blocks"));
        assert_eq!(decode_registration(&[0x01]), Err(RegistrationError::NotAMap(Value::from(1))));
        let negative = cat(&[&[0x82], &fixstr("max_model_len"), &[0xff], &fixstr("num_gpu_blocks"), &[0x10]]);
        assert!(matches!(
            decode_registration(&negative),
            Err(RegistrationError::NotACount { key: "max_model_len", .. })
        ));
        assert!(matches!(decode_registration(&[0x81]), Err(RegistrationError::Decode(DecodeError::Malformed(_)))));
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn encode(value: &Value) -> Vec<u8> {
            let mut bytes = Vec::new();
            rmpv::encode::write_value(&mut bytes, value).unwrap();
            bytes
        }

        /// A well-formed EngineCoreOutputs with batch outputs, stats and finished ids.
        fn outputs_message() -> impl Strategy<Value = Vec<u8>> {
            let output =
                ("[a-z0-9-]{0,12}", proptest::collection::vec(any::<u32>(), 0..8), proptest::option::of(0i64..5))
                    .prop_map(|(id, tokens, finish)| {
                        Value::Array(vec![
                            Value::from(id),
                            Value::Array(tokens.into_iter().map(Value::from).collect()),
                            Value::Nil,
                            Value::Nil,
                            Value::Nil,
                            finish.map_or(Value::Nil, Value::from),
                            Value::Nil,
                        ])
                    });
            (any::<u16>(), proptest::collection::vec(output, 0..4), proptest::collection::vec("[a-z]{0,6}", 0..3))
                .prop_map(|(engine, outputs, finished)| {
                    encode(&Value::Array(vec![
                        Value::from(engine),
                        Value::Array(outputs),
                        Value::Map(vec![(Value::from("num_running_reqs"), Value::from(1))]),
                        Value::F64(1.0),
                        Value::Nil,
                        Value::Array(finished.into_iter().map(Value::from).collect()),
                    ]))
                })
        }

        /// A mutation of a message: a byte overwritten, bytes cut off or inserted.
        #[derive(Debug, Clone)]
        enum Mutation {
            Set(usize, u8),
            Truncate(usize),
            Insert(usize, Vec<u8>),
        }

        fn mutation() -> impl Strategy<Value = Mutation> {
            prop_oneof![
                (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set(at, byte)),
                any::<usize>().prop_map(Mutation::Truncate),
                (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..6))
                    .prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
            ]
        }

        fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
            let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
            match mutation {
                Mutation::Set(i, byte) if !bytes.is_empty() => {
                    let i = at(*i, bytes.len());
                    bytes[i] = *byte;
                }
                Mutation::Set(..) => {}
                Mutation::Truncate(i) => bytes.truncate(at(*i, bytes.len() + 1)),
                Mutation::Insert(i, new) => {
                    let i = at(*i, bytes.len() + 1);
                    bytes.splice(i..i, new.iter().copied());
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                let _ = decode_outputs(&bytes, &[]);
                let _ = decode_registration(&bytes);
            }

            #[test]
            fn valid_messages_decode_and_their_mutations_never_panic(
                message in outputs_message(),
                mutations in proptest::collection::vec(mutation(), 1..4),
            ) {
                prop_assert!(decode_outputs(&message, &[]).is_ok(), "{message:x?}");
                let mut mutated = message;
                for m in &mutations {
                    apply(&mut mutated, m);
                }
                let _ = decode_outputs(&mutated, &[]);
            }
        }
    }
}
