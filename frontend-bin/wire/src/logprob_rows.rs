//! Logprobs as engines send them (docs: engine-protocol.md, "Logprobs"):
//! vLLM's `LogprobsLists` (`new_logprobs`) and `LogprobsTensors`
//! (`new_prompt_logprobs_tensors`), three arrays `[dtype, shape, data]` each,
//! the data inline (msgpack extension 3) or the index of an aux frame.

use super::msgpack::Cursor;
use bytes::Bytes;

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

/// One array: its dtype, shape and raw little-endian bytes.
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

fn read_array<'a>(
    cursor: &mut Cursor<'a>,
    aux: &'a [Bytes],
    dtype_of: fn(&str) -> Option<Dtype>,
    what: &str,
) -> Result<Array<'a>, RowsError> {
    let bad = |e: super::msgpack::ReadError| RowsError { what: what.to_owned(), why: e.0 };
    if cursor.read_array_len().map_err(bad)? != 3 {
        return fail(what, "is not (dtype, shape, data)");
    }
    let name = cursor.read_str().map_err(bad)?;
    let Some(dtype) = dtype_of(name) else {
        return fail(
            what,
            format!("has dtype {:?}, not one vLLM writes there", name.chars().take(40).collect::<String>()),
        );
    };
    let dims = cursor.read_array_len().map_err(bad)?;
    if dims > 8 {
        return fail(what, "has no valid shape");
    }
    let shape = (0..dims).map(|_| cursor.read_u64().map(|d| d as usize)).collect::<Result<Vec<_>, _>>().map_err(bad)?;
    let data: &'a [u8] = if cursor.next_is_ext() {
        match cursor.read_ext().map_err(bad)? {
            (RAW_VIEW_EXT, data) => data,
            (kind, _) => return fail(what, format!("data is extension {kind}, not 3")),
        }
    } else {
        // Frame 0 is the message itself; aux frame i is frame i + 1.
        match cursor.read_u64().ok().and_then(|i| usize::try_from(i).ok()).and_then(|i| aux.get(i.checked_sub(1)?)) {
            Some(frame) => frame,
            None => return fail(what, "data is neither inline (extension 3) nor an aux frame index"),
        }
    };
    let elements = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if elements.and_then(|n| n.checked_mul(dtype.size())) != Some(data.len()) {
        return fail(what, "data does not fit its shape");
    }
    Ok(Array { dtype, shape, data })
}

/// Reads one `LogprobsLists` or `LogprobsTensors` at `cursor` (`aux` the
/// message's frames after the first); an error names `what` and the flaw.
pub fn read_rows<'a>(cursor: &mut Cursor<'a>, aux: &'a [Bytes], what: &str) -> Result<LogprobRows, RowsError> {
    let bad = |e: super::msgpack::ReadError| RowsError { what: what.to_owned(), why: e.0 };
    let fields = cursor.read_array_len().map_err(bad)?;
    if fields < 3 {
        return fail(what, "is not (token_ids, logprobs, ranks, ...)");
    }
    let ids = read_array(cursor, aux, integer_dtype, &format!("{what}[0]"))?;
    let logprobs = read_array(cursor, aux, float_dtype, &format!("{what}[1]"))?;
    let ranks = read_array(cursor, aux, integer_dtype, &format!("{what}[2]"))?;
    for _ in 3..fields {
        cursor.skip().map_err(bad)?;
    }
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
