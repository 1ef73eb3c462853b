//! MessagePack encoding of frontend-to-engine payloads and lenient decoding of
//! engine-to-frontend messages (short arrays take their trailing defaults).

use super::logprob_rows::{read_rows, LogprobRows};
use super::msgpack::{Cursor, ReadError};
use super::protocol::{
    EngineEvent, EngineEventKind, EngineOutput, EngineRequest, FinishReason, OutputsMessage, PrefillStats,
    Registration, RequestError, SamplingParams, SchedulerStats, StopReason, TokenIds, UtilityReply, ENGINE_CORE_DEAD,
};
use bytes::Bytes;
use rmp::encode;
use rmpv::Value;
use serde::{Serialize, Serializer};
use smallvec::SmallVec;

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

// Writes into a Vec never fail; these helpers drop the impossible error.
fn put_array_len(buf: &mut Vec<u8>, len: u32) {
    encode::write_array_len(buf, len).expect("write to Vec");
}
fn put_str(buf: &mut Vec<u8>, s: &str) {
    encode::write_str(buf, s).expect("write to Vec");
}
fn put_uint(buf: &mut Vec<u8>, n: u64) {
    encode::write_uint(buf, n).expect("write to Vec");
}
fn put_int(buf: &mut Vec<u8>, n: i64) {
    encode::write_sint(buf, n).expect("write to Vec");
}

/// EngineCoreRequest as vLLM 0.33 decodes it: a msgpack array whose slots are
/// these fields in this order (through `external_req_id`, slot 16); `()` is a
/// slot this frontend always leaves nil.
#[derive(Serialize)]
struct EngineCoreRequestWire<'a> {
    request_id: &'a str,
    prompt_token_ids: &'a [u32],
    mm_features: (),
    sampling_params: SamplingParamsMap<'a>,
    pooling_params: (),
    arrival_time: f64,
    lora_request: (),
    cache_salt: (),
    data_parallel_rank: Option<u32>,
    prompt_embeds: (),
    prompt_is_token_ids: (),
    client_index: u32,
    current_wave: u64,
    priority: u32,
    trace_headers: (),
    resumable: bool,
    external_req_id: &'a str,
}

/// Encodes an ADD payload (EngineCoreRequest as an array) for request wave
/// `current_wave` (the coordinator's; 0 without one).
pub fn encode_add(req: &EngineRequest, current_wave: u64) -> Vec<u8> {
    let wire = EngineCoreRequestWire {
        request_id: &req.request_id,
        prompt_token_ids: &req.prompt_token_ids,
        mm_features: (),
        sampling_params: SamplingParamsMap(&req.sampling),
        pooling_params: (),
        arrival_time: req.arrival_time,
        lora_request: (),
        cache_salt: (),
        data_parallel_rank: req.data_parallel_rank,
        prompt_embeds: (),
        prompt_is_token_ids: (),
        client_index: req.client_index,
        current_wave,
        priority: 0,
        trace_headers: (),
        resumable: false,
        external_req_id: &req.external_request_id,
    };
    let mut buf = Vec::with_capacity(128 + 2 * req.prompt_token_ids.len());
    // Structs are arrays in rmp-serde's default (compact) form.
    wire.serialize(&mut rmp_serde::Serializer::new(&mut buf)).expect("write to Vec");
    buf
}

/// A value of the sampling-params map, written as the bare msgpack value.
#[derive(Serialize)]
#[serde(untagged)]
enum SamplingValue<'a> {
    Float(f64),
    Int(i64),
    Count(u64),
    Flag(bool),
    Ids(&'a [u32]),
    Json(&'a serde_json::Value),
}

/// The sampling-params map: string keys, unset values left out.
struct SamplingParamsMap<'a>(&'a SamplingParams);

impl Serialize for SamplingParamsMap<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use SamplingValue as V;
        let p = self.0;
        let mut entries: Vec<(&str, V)> = Vec::with_capacity(14);
        let floats = [
            ("temperature", p.temperature),
            ("top_p", p.top_p),
            ("min_p", p.min_p),
            ("frequency_penalty", p.frequency_penalty),
            ("presence_penalty", p.presence_penalty),
            ("repetition_penalty", p.repetition_penalty),
        ];
        entries.extend(floats.into_iter().filter_map(|(k, v)| v.map(|v| (k, V::Float(v)))));
        if let Some(v) = p.top_k {
            entries.push(("top_k", V::Int(v)));
        }
        if let Some(v) = p.max_tokens {
            entries.push(("max_tokens", V::Count(v)));
        }
        if let Some(v) = p.min_tokens {
            entries.push(("min_tokens", V::Count(v)));
        }
        entries.push(("stop_token_ids", V::Ids(&p.stop_token_ids)));
        entries.push(("_all_stop_token_ids", V::Ids(&p.all_stop_token_ids)));
        if let Some(v) = p.seed {
            entries.push(("seed", V::Int(v)));
        }
        if let Some(v) = p.eos_token_id {
            entries.push(("_eos_token_id", V::Count(v.into())));
        }
        if p.ignore_eos {
            entries.push(("ignore_eos", V::Flag(true)));
        }
        if let Some(v) = &p.structured_outputs {
            entries.push(("structured_outputs", V::Json(v)));
        }
        if let Some(v) = p.logprobs {
            entries.push(("logprobs", V::Int(v)));
        }
        if let Some(v) = p.prompt_logprobs {
            entries.push(("prompt_logprobs", V::Int(v)));
        }
        serializer.collect_map(entries)
    }
}

/// Encodes an ABORT payload: the array of request ids.
pub fn encode_abort<S: AsRef<str>>(request_ids: &[S]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(16 + 24 * request_ids.len());
    put_array_len(&mut buf, request_ids.len() as u32);
    for id in request_ids {
        put_str(&mut buf, id.as_ref());
    }
    buf
}

/// Encodes a UTILITY payload: `[client_index, call_id, method_name, args]`.
pub fn encode_utility(client_index: u32, call_id: i64, method: &str, args: &[Value]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(32 + method.len());
    put_array_len(&mut buf, 4);
    put_uint(&mut buf, client_index.into());
    put_int(&mut buf, call_id);
    put_str(&mut buf, method);
    rmpv::encode::write_value(&mut buf, &Value::Array(args.to_vec())).expect("write to Vec");
    buf
}

/// Decodes one complete msgpack value, rejecting trailing bytes.
fn read_value(bytes: &[u8]) -> Result<Value, DecodeError> {
    let mut rest = bytes;
    let value = rmpv::decode::read_value(&mut rest).map_err(|e| malformed(format!("not msgpack: {e}")))?;
    if !rest.is_empty() {
        return Err(malformed(format!("{} trailing bytes", rest.len())));
    }
    Ok(value)
}

/// Attaches what was being read to a reader error.
fn at(what: &'static str) -> impl Fn(ReadError) -> DecodeError {
    move |e| malformed(format!("{what}: {}", e.0))
}

/// Reads a short-able array: slots past its end, and nil slots, are `None`.
struct Slots<'c, 'a> {
    cursor: &'c mut Cursor<'a>,
    len: usize,
    next: usize,
}

impl<'c, 'a> Slots<'c, 'a> {
    fn new(cursor: &'c mut Cursor<'a>, what: &'static str) -> Result<Self, DecodeError> {
        let len = cursor.read_array_len().map_err(at(what))?;
        Ok(Slots { cursor, len, next: 0 })
    }

    /// The cursor at the next slot if it is present and not nil (the caller reads it).
    fn present(&mut self) -> Result<Option<&mut Cursor<'a>>, DecodeError> {
        if self.next >= self.len {
            return Ok(None);
        }
        self.next += 1;
        if self.cursor.read_nil().map_err(at("slot"))? {
            return Ok(None);
        }
        Ok(Some(&mut *self.cursor))
    }

    /// Skips the slots not read.
    fn finish(self) -> Result<(), DecodeError> {
        for _ in self.next..self.len {
            self.cursor.skip().map_err(at("trailing slot"))?;
        }
        Ok(())
    }
}

/// Decodes one message from the output socket: its frames are
/// `[EngineCoreOutputs, aux frames...]` or the single frame `ENGINE_CORE_DEAD`.
/// Strings in the result borrow from `frame` (the first frame); `aux` are
/// the frames after it, which hold large logprobs arrays.
pub fn decode_outputs<'a>(frame: &'a [u8], aux: &'a [Bytes]) -> Result<OutputsMessage<'a>, DecodeError> {
    if frame == ENGINE_CORE_DEAD {
        return Ok(OutputsMessage::EngineDead);
    }
    let mut cursor = Cursor::new(frame);
    let mut slots = Slots::new(&mut cursor, "EngineCoreOutputs")?;
    let engine_index = match slots.present()? {
        Some(c) => c.read_u32().map_err(at("engine_index"))?,
        None => 0,
    };
    let mut outputs = Vec::new();
    if let Some(c) = slots.present()? {
        let count = c.read_array_len().map_err(at("outputs"))?;
        outputs.reserve(count.min(4096));
        for _ in 0..count {
            outputs.push(decode_output(c, aux)?);
        }
    }
    let stats = slots.present()?.map(decode_stats).transpose()?;
    let timestamp = match slots.present()? {
        Some(c) => c.read_f64().map_err(at("timestamp"))?,
        None => 0.0,
    };
    let utility = slots.present()?.map(decode_utility).transpose()?;
    let mut finished_requests = Vec::new();
    if let Some(c) = slots.present()? {
        let count = c.read_array_len().map_err(at("finished_requests"))?;
        for _ in 0..count {
            finished_requests.push(c.read_str().map_err(at("finished_requests"))?);
        }
    }
    let wave_complete = slots.present()?.map(|c| c.read_i64().map_err(at("wave_complete"))).transpose()?;
    let start_wave = slots.present()?.map(|c| c.read_i64().map_err(at("start_wave"))).transpose()?;
    slots.finish()?;
    if cursor.remaining() > 0 {
        return Err(malformed(format!("{} trailing bytes", cursor.remaining())));
    }

    let is_batch = !outputs.is_empty() || stats.is_some() || !finished_requests.is_empty();
    let is_wave = wave_complete.is_some() || start_wave.is_some();
    match (is_batch, utility, is_wave) {
        (true, None, false) => Ok(OutputsMessage::Batch { engine_index, outputs, timestamp, stats, finished_requests }),
        (false, Some(reply), false) => Ok(OutputsMessage::Utility { engine_index, reply }),
        (false, None, true) => Ok(OutputsMessage::Wave { engine_index, wave_complete, start_wave }),
        (false, None, false) => Err(DecodeError::Protocol(format!("empty outputs message from engine {engine_index}"))),
        _ => Err(DecodeError::Protocol(format!(
            "outputs message from engine {engine_index} mixes request outputs, a utility reply and wave fields"
        ))),
    }
}

/// Slot of `finish_reason` in an EngineCoreOutput.
const FINISH_REASON_SLOT: usize = 5;

/// Reads a logprobs slot (present and not nil) as rows.
fn logprob_slot<'a>(
    slots: &mut Slots<'_, 'a>,
    aux: &'a [Bytes],
    what: &str,
) -> Result<Option<Box<LogprobRows>>, DecodeError> {
    match slots.present()? {
        Some(c) => Ok(Some(Box::new(read_rows(c, aux, what).map_err(|e| malformed(e.to_string()))?))),
        None => Ok(None),
    }
}

fn decode_output<'a>(cursor: &mut Cursor<'a>, aux: &'a [Bytes]) -> Result<EngineOutput<'a>, DecodeError> {
    let mut slots = Slots::new(cursor, "EngineCoreOutput")?;
    if slots.len < 2 {
        return Err(malformed(format!("EngineCoreOutput has {} slots, needs at least 2", slots.len)));
    }
    let request_id = match slots.present()? {
        Some(c) => c.read_str().map_err(at("request_id"))?,
        None => return Err(malformed("request_id is nil")),
    };
    let mut new_token_ids = TokenIds::default();
    if let Some(c) = slots.present()? {
        let count = c.read_array_len().map_err(at("new_token_ids"))?;
        new_token_ids = TokenIds::with_capacity(count.min(65536));
        for _ in 0..count {
            new_token_ids.push(c.read_u32().map_err(at("new_token_ids"))?);
        }
    }
    let logprobs = logprob_slot(&mut slots, aux, "new_logprobs")?;
    let prompt_logprobs = logprob_slot(&mut slots, aux, "new_prompt_logprobs_tensors")?;
    while slots.next < FINISH_REASON_SLOT.min(slots.len) {
        if let Some(c) = slots.present()? {
            c.skip().map_err(at("EngineCoreOutput"))?;
        }
    }
    let finish_reason = match slots.present()? {
        Some(c) => {
            let code = c.read_i64().map_err(at("finish_reason"))?;
            Some(FinishReason::from_code(code).ok_or_else(|| malformed(format!("unknown finish_reason {code}")))?)
        }
        None => None,
    };
    let stop_reason = match slots.present()? {
        None => None,
        Some(c) if c.next_is_str() => Some(StopReason::Text(c.read_str().map_err(at("stop_reason"))?.to_owned())),
        Some(c) => Some(StopReason::Token(c.read_i64().map_err(at("stop_reason"))?)),
    };
    let events = match slots.present()? {
        Some(c) => decode_events(c)?,
        None => SmallVec::new(),
    };
    skip_slots_until(&mut slots, PREFILL_STATS_SLOT)?;
    let prefill_stats = slots.present()?.map(decode_prefill_stats).transpose()?;
    skip_slots_until(&mut slots, NUM_NANS_SLOT)?;
    let num_nans_in_logits = match slots.present()? {
        Some(c) => c.read_u32().map_err(at("num_nans_in_logits"))?,
        None => 0,
    };
    skip_slots_until(&mut slots, ERROR_SLOT)?;
    let error = slots.present()?.map(decode_request_error).transpose()?;
    slots.finish()?;
    Ok(EngineOutput {
        request_id,
        new_token_ids,
        logprobs,
        prompt_logprobs,
        finish_reason,
        stop_reason,
        error,
        events,
        prefill_stats,
        num_nans_in_logits,
    })
}

/// Skips the slots before `slot` (those present and not read).
fn skip_slots_until(slots: &mut Slots<'_, '_>, slot: usize) -> Result<(), DecodeError> {
    while slots.next < slot.min(slots.len) {
        if let Some(c) = slots.present()? {
            c.skip().map_err(at("EngineCoreOutput"))?;
        }
    }
    Ok(())
}

/// Slot of `prefill_stats` in an EngineCoreOutput.
const PREFILL_STATS_SLOT: usize = 11;
/// Slot of `num_nans_in_logits` in an EngineCoreOutput.
const NUM_NANS_SLOT: usize = 13;

/// Reads the fields of a struct msgspec wrote as a map (by name) or as an
/// array (by position in `fields`), handing each to `field` by index.
fn read_struct(
    cursor: &mut Cursor<'_>,
    what: &'static str,
    fields: &[&str],
    mut field: impl FnMut(usize, &mut Cursor<'_>) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    if let Ok(len) = cursor.clone().read_array_len() {
        cursor.read_array_len().map_err(at(what))?;
        for i in 0..len {
            if i < fields.len() && !cursor.clone().read_nil().map_err(at(what))? {
                field(i, cursor)?;
            } else {
                cursor.skip().map_err(at(what))?;
            }
        }
        return Ok(());
    }
    let entries = cursor.read_map_len().map_err(at(what))?;
    for _ in 0..entries {
        let key = if cursor.next_is_str() { Some(cursor.read_str().map_err(at(what))?) } else { None };
        match key.and_then(|key| fields.iter().position(|f| *f == key)) {
            Some(i) if !cursor.clone().read_nil().map_err(at(what))? => field(i, cursor)?,
            Some(_) => cursor.skip().map_err(at(what))?,
            None => {
                if key.is_none() {
                    cursor.skip().map_err(at(what))?;
                }
                cursor.skip().map_err(at(what))?;
            }
        }
    }
    Ok(())
}

/// vLLM's `events`: `EngineCoreEvent`s (`type`, `timestamp`); kinds this
/// frontend does not know are skipped.
fn decode_events(cursor: &mut Cursor<'_>) -> Result<SmallVec<[EngineEvent; 2]>, DecodeError> {
    let count = cursor.read_array_len().map_err(at("events"))?;
    let mut events = SmallVec::new();
    for _ in 0..count {
        let (mut code, mut timestamp) = (0, 0.0);
        read_struct(cursor, "events", &["type", "timestamp"], |i, c| {
            match i {
                0 => code = c.read_i64().map_err(at("events.type"))?,
                _ => timestamp = c.read_f64().map_err(at("events.timestamp"))?,
            }
            Ok(())
        })?;
        if let Some(kind) = EngineEventKind::from_code(code) {
            events.push(EngineEvent { kind, timestamp });
        }
    }
    Ok(events)
}

/// vLLM's `PrefillStats`.
fn decode_prefill_stats(cursor: &mut Cursor<'_>) -> Result<PrefillStats, DecodeError> {
    const FIELDS: [&str; 5] = [
        "num_prompt_tokens",
        "num_computed_tokens",
        "num_cached_tokens",
        "num_local_cached_tokens",
        "num_external_cached_tokens",
    ];
    let mut values = [0u64; 5];
    read_struct(cursor, "prefill_stats", &FIELDS, |i, c| {
        values[i] = c.read_u64().map_err(at("prefill_stats"))?;
        Ok(())
    })?;
    let [num_prompt_tokens, num_computed_tokens, num_cached_tokens, num_local_cached_tokens, num_external_cached_tokens] =
        values;
    Ok(PrefillStats {
        num_prompt_tokens,
        num_computed_tokens,
        num_cached_tokens,
        num_local_cached_tokens,
        num_external_cached_tokens,
    })
}

/// Slot of `error` (a `RequestError`) in an EngineCoreOutput.
const ERROR_SLOT: usize = 18;

/// vLLM's `RequestError`, a dataclass msgspec writes as a map.
fn decode_request_error(cursor: &mut Cursor<'_>) -> Result<RequestError, DecodeError> {
    let entries = cursor.read_map_len().map_err(at("error"))?;
    let mut error = RequestError { code: String::new(), message: String::new(), retryable: false };
    for _ in 0..entries {
        let key = if cursor.next_is_str() { Some(cursor.read_str().map_err(at("error"))?) } else { None };
        match key {
            Some("code") => error.code = cursor.read_str().map_err(at("error.code"))?.to_owned(),
            Some("message") => error.message = cursor.read_str().map_err(at("error.message"))?.to_owned(),
            Some("retryable") => error.retryable = cursor.read_bool().map_err(at("error.retryable"))?,
            Some(_) => cursor.skip().map_err(at("error"))?,
            None => {
                cursor.skip().map_err(at("error"))?;
                cursor.skip().map_err(at("error"))?;
            }
        }
    }
    Ok(error)
}

fn decode_stats(cursor: &mut Cursor<'_>) -> Result<SchedulerStats, DecodeError> {
    let entries = cursor.read_map_len().map_err(at("scheduler_stats"))?;
    let mut stats = SchedulerStats::default();
    for _ in 0..entries {
        let key = if cursor.next_is_str() {
            Some(cursor.read_str().map_err(at("scheduler_stats"))?)
        } else {
            cursor.skip().map_err(at("scheduler_stats"))?;
            None
        };
        match key {
            Some("num_running_reqs") => stats.num_running_reqs = cursor.read_u64().map_err(at("num_running_reqs"))?,
            Some("num_waiting_reqs") => stats.num_waiting_reqs = cursor.read_u64().map_err(at("num_waiting_reqs"))?,
            Some("num_skipped_waiting_reqs") => {
                stats.num_skipped_waiting_reqs = cursor.read_u64().map_err(at("num_skipped_waiting_reqs"))?
            }
            Some("kv_cache_usage") => stats.kv_cache_usage = cursor.read_f64().map_err(at("kv_cache_usage"))?,
            Some("prefix_cache_stats") if !cursor.clone().read_nil().map_err(at("prefix_cache_stats"))? => {
                read_struct(cursor, "prefix_cache_stats", &["queries", "hits"], |i, c| {
                    let value = c.read_u64().map_err(at("prefix_cache_stats"))?;
                    match i {
                        0 => stats.prefix_cache_queries = value,
                        _ => stats.prefix_cache_hits = value,
                    }
                    Ok(())
                })?
            }
            _ => cursor.skip().map_err(at("scheduler_stats"))?,
        }
    }
    Ok(stats)
}

fn decode_utility(cursor: &mut Cursor<'_>) -> Result<UtilityReply, DecodeError> {
    let mut slots = Slots::new(cursor, "UtilityOutput")?;
    let call_id = match slots.present()? {
        Some(c) => c.read_i64().map_err(at("call_id"))?,
        None => return Err(malformed("UtilityOutput without call_id")),
    };
    let failure_message = match slots.present()? {
        Some(c) => Some(c.read_str().map_err(at("failure_message"))?.to_owned()),
        None => None,
    };
    let result = match slots.present()? {
        Some(c) => {
            // [type_info | nil, result]: the result is decoded as a generic value.
            let raw = c.read_raw().map_err(at("UtilityResult"))?;
            match read_value(raw)? {
                Value::Array(mut items) if items.len() >= 2 => Some(items.swap_remove(1)),
                Value::Array(_) => None,
                other => return Err(malformed(format!("UtilityResult: expected an array, got {other}"))),
            }
        }
        None => None,
    };
    slots.finish()?;
    Ok(UtilityReply { call_id, failure_message, result })
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
        };
        let expected = cat(&[
            &[0xdc, 0x00, 0x11], // array16 of 17
            &fixstr("r-1"),
            &[0x92, 0x01, 0xcd, 0x01, 0x2c], // [1, 300]
            &[0xc0],                         // mm_features
            &[0x84],                         // map of 4
            &fixstr("temperature"),
            &[0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0], // 0.5
            &fixstr("max_tokens"),
            &[0x05],
            &fixstr("stop_token_ids"),
            &[0x90],
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
        ]);
        assert_eq!(encode_add(&req, 0), expected);
    }

    #[test]
    fn sampling_params_include_seed_eos_and_ignore_eos_when_set() {
        let mut buf = Vec::new();
        let p = SamplingParams {
            seed: Some(-1),
            eos_token_id: Some(256),
            ignore_eos: true,
            stop_token_ids: vec![7],
            all_stop_token_ids: vec![7, 256],
            ..Default::default()
        };
        SamplingParamsMap(&p).serialize(&mut rmp_serde::Serializer::new(&mut buf)).unwrap();
        let expected = cat(&[
            &[0x85],
            &fixstr("stop_token_ids"),
            &[0x91, 0x07],
            &fixstr("_all_stop_token_ids"),
            &[0x92, 0x07, 0xcd, 0x01, 0x00],
            &fixstr("seed"),
            &[0xff],
            &fixstr("_eos_token_id"),
            &[0xcd, 0x01, 0x00],
            &fixstr("ignore_eos"),
            &[0xc3],
        ]);
        assert_eq!(buf, expected);
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
        let msg = decode_outputs(&bytes, &[]).unwrap();
        let expected = OutputsMessage::Batch {
            engine_index: 0,
            outputs: vec![EngineOutput {
                request_id: "r1",
                new_token_ids: vec![65, 66].into(),
                logprobs: None,
                prompt_logprobs: None,
                finish_reason: None,
                stop_reason: None,
                error: None,
                events: SmallVec::new(),
                prefill_stats: None,
                num_nans_in_logits: 0,
            }],
            timestamp: 0.0,
            stats: None,
            finished_requests: vec![],
        };
        assert_eq!(msg, expected);
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
            prefix_cache_queries: 48,
            prefix_cache_hits: 32,
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
        let reply = UtilityReply { call_id: 5, failure_message: None, result: Some(Value::from("ok")) };
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
        assert_eq!(outputs[0].logprobs.as_deref().unwrap().row(0), (&[5u32, 6][..], &[-1f32, -2.0][..], 1));
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
