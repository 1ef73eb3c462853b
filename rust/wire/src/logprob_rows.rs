//! Logprobs as engines send them (docs: engine-protocol.md, "Logprobs"):
//! vLLM 0.33's `vllm/v1/outputs.py::LogprobsLists` (`new_logprobs`) and
//! `LogprobsTensors` (`new_prompt_logprobs_tensors`), three arrays
//! `[dtype, shape, data]` first, the data inline (msgpack extension 3) or the
//! index of an aux frame. Decoding borrows the arrays from the frame
//! ([`Logprobs::Wire`]); resolving them against the aux frames checks them and
//! makes the rows ([`Logprobs::Rows`]).

use bytes::Bytes;
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_tuple::Deserialize_tuple;
use smallvec::SmallVec;
use std::fmt;

/// vLLM's msgpack extension code for an inline raw array buffer.
const RAW_VIEW_EXT: i8 = 3;

/// Scored positions of one engine output: `rows` rows of `width` columns
/// (column 0 the scored token, then the top k), flattened row by row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogprobRows {
    /// Columns per row (k + 1).
    pub width: usize,
    /// Token ids, `rows * width`.
    pub token_ids: Vec<u32>,
    /// Their logprobs, `rows * width`.
    pub logprobs: Vec<f32>,
    /// The scored token's rank per row (1 = the most likely).
    pub ranks: Vec<i64>,
}

impl LogprobRows {
    /// Number of rows (scored positions).
    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    /// Row `i`: its token ids, their logprobs, and the scored token's rank.
    pub fn row(&self, i: usize) -> (&[u32], &[f32], i64) {
        let cols = i * self.width..(i + 1) * self.width;
        (&self.token_ids[cols.clone()], &self.logprobs[cols], self.ranks[i])
    }

    /// Keeps the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        if rows < self.len() {
            self.token_ids.truncate(rows * self.width);
            self.logprobs.truncate(rows * self.width);
            self.ranks.truncate(rows);
        }
    }
}

/// Why logprobs could not be read.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{what}: {why}")]
pub struct RowsError {
    what: String,
    why: String,
}

fn fail<T>(what: &str, why: impl Into<String>) -> Result<T, RowsError> {
    Err(RowsError { what: what.to_owned(), why: why.into() })
}

/// Element types an array may have on the wire (numpy's names for the
/// lists, torch's for the tensors).
#[derive(Clone, Copy)]
enum Dtype {
    I32,
    I64,
    F32,
    F16,
    Bf16,
}

impl Dtype {
    fn size(self) -> usize {
        match self {
            Dtype::I32 | Dtype::F32 => 4,
            Dtype::I64 => 8,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }
}

/// Which dtypes each of the three arrays accepts, as vLLM writes them.
fn integer_dtype(name: &str) -> Option<Dtype> {
    match name {
        "<i4" | "int32" => Some(Dtype::I32),
        "<i8" | "int64" => Some(Dtype::I64),
        _ => None,
    }
}

fn float_dtype(name: &str) -> Option<Dtype> {
    match name {
        "<f4" | "float32" => Some(Dtype::F32),
        "<f2" | "float16" => Some(Dtype::F16),
        "bfloat16" => Some(Dtype::Bf16),
        _ => None,
    }
}

/// The data of one array: its bytes inline (extension 3), or the index of
/// the message frame that holds them (frame 0 is the message itself).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArrayData<'a> {
    /// The raw bytes, borrowed from the frame.
    Inline(&'a [u8]),
    /// The frame index.
    Frame(u64),
}

/// Reads either form. rmp-serde hands an extension to `deserialize_any` as a
/// newtype struct whose content is the sequence `(type code, bytes)`.
impl<'de: 'a, 'a> Deserialize<'de> for ArrayData<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DataVisitor;
        impl<'de> Visitor<'de> for DataVisitor {
            type Value = ArrayData<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("raw array data (extension 3) or an aux frame index")
            }
            fn visit_u64<E: de::Error>(self, index: u64) -> Result<ArrayData<'de>, E> {
                Ok(ArrayData::Frame(index))
            }
            fn visit_newtype_struct<D: Deserializer<'de>>(self, ext: D) -> Result<ArrayData<'de>, D::Error> {
                ext.deserialize_any(ExtVisitor)
            }
        }
        struct ExtVisitor;
        impl<'de> Visitor<'de> for ExtVisitor {
            type Value = ArrayData<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a msgpack extension")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ArrayData<'de>, A::Error> {
                let kind: i8 = seq.next_element()?.ok_or_else(|| de::Error::custom("extension without a type"))?;
                let data: &'de [u8] = seq.next_element()?.ok_or_else(|| de::Error::custom("extension without data"))?;
                if kind != RAW_VIEW_EXT {
                    return Err(de::Error::custom(format!("array data is extension {kind}, not {RAW_VIEW_EXT}")));
                }
                Ok(ArrayData::Inline(data))
            }
        }
        deserializer.deserialize_any(DataVisitor)
    }
}

/// One array as sent: vLLM's `[dtype, shape, data]` (its encoder's form of
/// a numpy array or a torch tensor), borrowed from the frame.
#[derive(Clone, Debug, PartialEq, Deserialize_tuple)]
pub struct WireArray<'a> {
    /// numpy's or torch's name of the element type.
    pub dtype: &'a str,
    /// Its dimensions.
    pub shape: SmallVec<[u64; 2]>,
    /// Its bytes, little-endian.
    #[serde(borrow)]
    pub data: ArrayData<'a>,
}

/// The first three arrays of a `LogprobsLists` / `LogprobsTensors` (token
/// ids, logprobs, ranks); the fields after them are skipped.
#[derive(Clone, Debug, PartialEq)]
pub struct WireLogprobs<'a> {
    /// Token ids, `[rows, width]`.
    pub token_ids: WireArray<'a>,
    /// Their logprobs, `[rows, width]`.
    pub logprobs: WireArray<'a>,
    /// The scored token's rank, `[rows]`.
    pub ranks: WireArray<'a>,
}

impl<'de: 'a, 'a> Deserialize<'de> for WireLogprobs<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldsVisitor;
        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = WireLogprobs<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("(token_ids, logprobs, ranks, ...)")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<WireLogprobs<'de>, A::Error> {
                let mut next = || -> Result<WireArray<'de>, A::Error> {
                    seq.next_element()?.ok_or_else(|| de::Error::custom("is not (token_ids, logprobs, ranks, ...)"))
                };
                let (token_ids, logprobs, ranks) = (next()?, next()?, next()?);
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(WireLogprobs { token_ids, logprobs, ranks })
            }
        }
        deserializer.deserialize_seq(FieldsVisitor)
    }
}

/// The logprobs of one output: as decoded (borrowed arrays), or once
/// `decode_outputs` resolved them, as rows.
#[derive(Clone, Debug, PartialEq)]
pub enum Logprobs<'a> {
    /// The arrays as sent (boxed: an output without logprobs stays small).
    Wire(Box<WireLogprobs<'a>>),
    /// The checked rows.
    Rows(Box<LogprobRows>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Logprobs<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        WireLogprobs::deserialize(deserializer).map(|wire| Logprobs::Wire(Box::new(wire)))
    }
}

impl Logprobs<'_> {
    /// Checks the arrays and makes them rows (`aux` the message's frames
    /// after the first); an error names `what` and the flaw.
    pub fn resolve(&mut self, aux: &[Bytes], what: &str) -> Result<(), RowsError> {
        if let Logprobs::Wire(wire) = self {
            *self = Logprobs::Rows(Box::new(wire.rows(aux, what)?));
        }
        Ok(())
    }

    /// The rows, once resolved.
    pub fn rows(&self) -> Option<&LogprobRows> {
        match self {
            Logprobs::Rows(rows) => Some(rows),
            Logprobs::Wire(_) => None,
        }
    }

    /// The rows, once resolved.
    pub fn into_rows(self) -> Option<Box<LogprobRows>> {
        match self {
            Logprobs::Rows(rows) => Some(rows),
            Logprobs::Wire(_) => None,
        }
    }
}

/// One array checked: its dtype, shape and raw little-endian bytes.
struct Array<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: &'a [u8],
}

impl Array<'_> {
    fn ints(&self) -> impl Iterator<Item = i64> + '_ {
        let size = self.dtype.size();
        self.data.chunks_exact(size).map(move |c| match self.dtype {
            Dtype::I32 => i32::from_le_bytes(c.try_into().expect("4 bytes")).into(),
            _ => i64::from_le_bytes(c.try_into().expect("8 bytes")),
        })
    }

    fn floats(&self) -> impl Iterator<Item = f32> + '_ {
        let size = self.dtype.size();
        self.data.chunks_exact(size).map(move |c| match self.dtype {
            Dtype::F32 => f32::from_le_bytes(c.try_into().expect("4 bytes")),
            Dtype::Bf16 => f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16),
            _ => f16_to_f32(u16::from_le_bytes([c[0], c[1]])),
        })
    }
}

/// An IEEE half-precision value as f32.
fn f16_to_f32(half: u16) -> f32 {
    let sign = if half & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exponent = i32::from((half >> 10) & 0x1f);
    let mantissa = f32::from(half & 0x3ff);
    sign * match exponent {
        0 => mantissa * 2f32.powi(-24),
        0x1f if mantissa == 0.0 => f32::INFINITY,
        0x1f => f32::NAN,
        e => (1.0 + mantissa / 1024.0) * 2f32.powi(e - 15),
    }
}

impl<'a> WireArray<'a> {
    /// Checks the dtype (one `dtype_of` accepts), the data (inline, or an
    /// existing aux frame) and that the data fits the shape.
    fn check<'b>(
        &self,
        aux: &'b [Bytes],
        dtype_of: fn(&str) -> Option<Dtype>,
        what: &str,
    ) -> Result<Array<'b>, RowsError>
    where
        'a: 'b,
    {
        let Some(dtype) = dtype_of(self.dtype) else {
            return fail(
                what,
                format!("has dtype {:?}, not one vLLM writes there", self.dtype.chars().take(40).collect::<String>()),
            );
        };
        if self.shape.len() > 8 {
            return fail(what, "has no valid shape");
        }
        let shape: Vec<usize> = self.shape.iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect();
        let data: &'b [u8] = match self.data {
            ArrayData::Inline(data) => data,
            // Frame 0 is the message itself; aux frame i is frame i + 1.
            ArrayData::Frame(i) => match usize::try_from(i).ok().and_then(|i| aux.get(i.checked_sub(1)?)) {
                Some(frame) => frame,
                None => return fail(what, "data is neither inline (extension 3) nor an aux frame index"),
            },
        };
        let elements = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        if elements.and_then(|n| n.checked_mul(dtype.size())) != Some(data.len()) {
            return fail(what, "data does not fit its shape");
        }
        Ok(Array { dtype, shape, data })
    }
}

impl WireLogprobs<'_> {
    /// The rows these arrays hold (`aux` the message's frames after the
    /// first); an error names `what` and the flaw.
    pub fn rows(&self, aux: &[Bytes], what: &str) -> Result<LogprobRows, RowsError> {
        let ids = self.token_ids.check(aux, integer_dtype, &format!("{what}[0]"))?;
        let logprobs = self.logprobs.check(aux, float_dtype, &format!("{what}[1]"))?;
        let ranks = self.ranks.check(aux, integer_dtype, &format!("{what}[2]"))?;
        let [rows, width] = ids.shape[..] else { return fail(what, "arrays have mismatched shapes") };
        if logprobs.shape != ids.shape || ranks.shape != [rows] {
            return fail(what, "arrays have mismatched shapes");
        }
        let token_ids = ids
            .ints()
            .map(|t| u32::try_from(t).ok())
            .collect::<Option<Vec<u32>>>()
            .map_or_else(|| fail(what, "holds a token id out of range"), Ok)?;
        Ok(LogprobRows { width, token_ids, logprobs: logprobs.floats().collect(), ranks: ranks.ints().collect() })
    }
}

/// A pooling request's result: the tensor as decoded (borrowed), or once
/// `decode_outputs` resolved it, its values as float32.
#[derive(Clone, Debug, PartialEq)]
pub enum Pooled<'a> {
    /// The array as sent.
    Wire(Box<WireArray<'a>>),
    /// The checked values, flattened.
    Values(Vec<f32>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Pooled<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        WireArray::deserialize(deserializer).map(|wire| Pooled::Wire(Box::new(wire)))
    }
}

impl Pooled<'_> {
    /// Checks the array (a float dtype, data that fits its shape) and reads
    /// its values (`aux` the message's frames after the first).
    pub fn resolve(&mut self, aux: &[Bytes], what: &str) -> Result<(), RowsError> {
        if let Pooled::Wire(wire) = self {
            *self = Pooled::Values(wire.check(aux, float_dtype, what)?.floats().collect());
        }
        Ok(())
    }

    /// The values, once resolved.
    pub fn into_values(self) -> Option<Vec<f32>> {
        match self {
            Pooled::Values(values) => Some(values),
            Pooled::Wire(_) => None,
        }
    }
}
