//! What the coordinator publishes to frontends: msgpack
//! `[counts, current_wave, engines_running]`.

use rmpv::Value;

/// Most engines a message may list (vLLM's data-parallel size is far below).
const MAX_ENGINES: usize = 1 << 16;

/// One engine's queue lengths, as the coordinator last heard them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineCounts {
    /// Requests waiting to be scheduled.
    pub waiting: u64,
    /// Requests running.
    pub running: u64,
    /// Fraction of the KV cache in use (0 when the coordinator sent none).
    pub kv_cache_usage: f64,
}

/// One published message.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Published {
    /// Every engine's counts, by engine index; `None` when the message only
    /// announces a wave change.
    pub counts: Option<Vec<EngineCounts>>,
    /// The request wave new requests belong to.
    pub current_wave: u64,
    /// Whether the engines are running a wave (false: paused, the next
    /// request starts wave `current_wave`).
    pub engines_running: bool,
}

/// Why a published message was not understood.
#[derive(Debug, thiserror::Error)]
#[error("undecodable coordinator message: {0}")]
pub struct PublishedDecodeError(String);

fn bad(why: impl Into<String>) -> PublishedDecodeError {
    PublishedDecodeError(why.into())
}

fn count(value: &Value, what: &str) -> Result<u64, PublishedDecodeError> {
    value.as_u64().ok_or_else(|| bad(format!("{what} is not a non-negative integer")))
}

fn engine_counts(value: &Value) -> Result<EngineCounts, PublishedDecodeError> {
    let items = value.as_array().ok_or_else(|| bad("an engine's counts are not an array"))?;
    if !(2..=3).contains(&items.len()) {
        return Err(bad(format!(
            "an engine's counts have {} items, not [waiting, running, kv_cache_usage]",
            items.len()
        )));
    }
    let kv_cache_usage = match items.get(2) {
        None => 0.0,
        Some(usage) => usage
            .as_f64()
            .or_else(|| usage.as_u64().map(|u| u as f64))
            .ok_or_else(|| bad("kv_cache_usage is not a number"))?,
    };
    Ok(EngineCounts { waiting: count(&items[0], "waiting")?, running: count(&items[1], "running")?, kv_cache_usage })
}

/// Decodes one message; anything but `[nil | [[w, r, kv], ...], wave, bool]`
/// is an error naming what was wrong.
pub fn decode_published(frame: &[u8]) -> Result<Published, PublishedDecodeError> {
    let mut reader = frame;
    let value = rmpv::decode::read_value(&mut reader).map_err(|e| bad(e.to_string()))?;
    if !reader.is_empty() {
        return Err(bad("trailing bytes after the message"));
    }
    let items = value.as_array().ok_or_else(|| bad("not an array"))?;
    let [counts, wave, running] = items.as_slice() else {
        return Err(bad(format!("{} items, not [counts, current_wave, engines_running]", items.len())));
    };
    let counts = match counts {
        Value::Nil => None,
        Value::Array(engines) if engines.len() <= MAX_ENGINES => {
            Some(engines.iter().map(engine_counts).collect::<Result<Vec<_>, _>>()?)
        }
        Value::Array(engines) => return Err(bad(format!("{} engines listed, more than {MAX_ENGINES}", engines.len()))),
        _ => return Err(bad("counts are neither nil nor an array")),
    };
    let current_wave = count(wave, "current_wave")?;
    let engines_running = running.as_bool().ok_or_else(|| bad("engines_running is not a boolean"))?;
    Ok(Published { counts, current_wave, engines_running })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(value: Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &value).unwrap();
        out
    }

    #[test]
    fn decodes_counts_and_wave_messages() {
        let counts = Value::Array(vec![
            Value::Array(vec![1.into(), 2.into(), 0.25.into()]),
            Value::Array(vec![0.into(), 5.into(), 0.into()]),
        ]);
        let message = decode_published(&encode(Value::Array(vec![counts, 3.into(), true.into()]))).unwrap();
        assert_eq!(
            message,
            Published {
                counts: Some(vec![
                    EngineCounts { waiting: 1, running: 2, kv_cache_usage: 0.25 },
                    EngineCounts { waiting: 0, running: 5, kv_cache_usage: 0.0 },
                ]),
                current_wave: 3,
                engines_running: true,
            }
        );
        let wave_only = decode_published(&encode(Value::Array(vec![Value::Nil, 4.into(), false.into()]))).unwrap();
        assert_eq!(wave_only, Published { counts: None, current_wave: 4, engines_running: false });
    }

    #[test]
    fn malformed_messages_name_what_is_wrong() {
        let cases = [
            (encode(Value::Nil), "not an array"),
            (encode(Value::Array(vec![Value::Nil, 1.into()])), "2 items"),
            (encode(Value::Array(vec![Value::Nil, (-1).into(), true.into()])), "current_wave"),
            (encode(Value::Array(vec![Value::Nil, 1.into(), 1.into()])), "engines_running"),
            (
                encode(Value::Array(vec![Value::Array(vec![Value::Array(vec![1.into()])]), 1.into(), true.into()])),
                "1 items",
            ),
            (
                encode(Value::Array(vec![
                    Value::Array(vec![Value::Array(vec!["x".into(), 1.into()])]),
                    1.into(),
                    true.into(),
                ])),
                "waiting",
            ),
            (encode(Value::Array(vec!["x".into(), 1.into(), true.into()])), "neither nil"),
            (vec![0x93, 0xc0], "undecodable"),
            (b"\x01".to_vec(), "not an array"),
        ];
        for (frame, expected) in cases {
            let error = decode_published(&frame).unwrap_err().to_string();
            assert!(error.contains(expected), "{error} lacks {expected}");
        }
        let mut trailing = encode(Value::Array(vec![Value::Nil, 1.into(), true.into()]));
        trailing.push(0);
        assert!(decode_published(&trailing).unwrap_err().to_string().contains("trailing"));
    }
}
