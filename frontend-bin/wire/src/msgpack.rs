//! A zero-copy MessagePack reader for the hot path: strings are borrowed from
//! the frame, nothing is built that is not kept, and any value can be skipped.

use rmp::Marker;

/// Why reading failed, with what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError(pub String);

/// Result of a read.
pub type ReadResult<T> = Result<T, ReadError>;

fn err<T>(message: impl Into<String>) -> ReadResult<T> {
    Err(ReadError(message.into()))
}

/// Deepest nesting `skip` follows before giving up (hostile input).
const MAX_DEPTH: usize = 64;

/// Reads MessagePack values one after the other from a byte slice.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn peek_marker(&self) -> ReadResult<Marker> {
        match self.buf.get(self.pos) {
            Some(&b) => Ok(Marker::from_u8(b)),
            None => err("unexpected end of data"),
        }
    }

    fn take(&mut self, n: usize) -> ReadResult<&'a [u8]> {
        match self.buf.get(self.pos..self.pos.saturating_add(n)) {
            Some(bytes) if self.pos.checked_add(n).is_some() => {
                self.pos += n;
                Ok(bytes)
            }
            _ => err(format!("truncated: needs {n} more bytes, has {}", self.remaining())),
        }
    }

    fn be(&mut self, n: usize) -> ReadResult<u64> {
        Ok(self.take(n)?.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// True (and consumed) when the next value is nil.
    pub fn read_nil(&mut self) -> ReadResult<bool> {
        if self.peek_marker()? == Marker::Null {
            self.pos += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// A boolean.
    pub fn read_bool(&mut self) -> ReadResult<bool> {
        let value = match self.peek_marker()? {
            Marker::True => true,
            Marker::False => false,
            other => return err(format!("expected a boolean, found {other:?}")),
        };
        self.pos += 1;
        Ok(value)
    }

    /// True when the next value is a string.
    pub fn next_is_str(&self) -> bool {
        matches!(self.peek_marker(), Ok(Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32))
    }

    /// An array header: the number of elements.
    pub fn read_array_len(&mut self) -> ReadResult<usize> {
        self.read_container_len("an array", |m| match m {
            Marker::FixArray(n) => Some(Ok(n)),
            Marker::Array16 => Some(Err(2)),
            Marker::Array32 => Some(Err(4)),
            _ => None,
        })
    }

    /// A map header: the number of key/value pairs.
    pub fn read_map_len(&mut self) -> ReadResult<usize> {
        self.read_container_len("a map", |m| match m {
            Marker::FixMap(n) => Some(Ok(n)),
            Marker::Map16 => Some(Err(2)),
            Marker::Map32 => Some(Err(4)),
            _ => None,
        })
    }

    /// A container header; `kind` maps a marker to its inline length
    /// (`Ok`) or the width of the length that follows (`Err`).
    fn read_container_len(
        &mut self,
        what: &str,
        kind: impl Fn(Marker) -> Option<Result<u8, usize>>,
    ) -> ReadResult<usize> {
        let marker = self.peek_marker()?;
        let Some(len) = kind(marker) else {
            return err(format!("expected {what}, got {marker:?}"));
        };
        self.pos += 1;
        match len {
            Ok(inline) => Ok(inline as usize),
            Err(width) => Ok(self.be(width)? as usize),
        }
    }

    /// An integer of any width, as i128 so that every u64 and i64 fits.
    fn read_integer(&mut self) -> ReadResult<i128> {
        let marker = self.peek_marker()?;
        self.pos += 1;
        Ok(match marker {
            Marker::FixPos(n) => n.into(),
            Marker::FixNeg(n) => n.into(),
            Marker::U8 => self.be(1)?.into(),
            Marker::U16 => self.be(2)?.into(),
            Marker::U32 => self.be(4)?.into(),
            Marker::U64 => self.be(8)?.into(),
            Marker::I8 => (self.be(1)? as u8 as i8).into(),
            Marker::I16 => (self.be(2)? as u16 as i16).into(),
            Marker::I32 => (self.be(4)? as u32 as i32).into(),
            Marker::I64 => (self.be(8)? as i64).into(),
            other => {
                self.pos -= 1;
                return err(format!("expected an integer, got {other:?}"));
            }
        })
    }

    /// A signed integer that fits in i64.
    pub fn read_i64(&mut self) -> ReadResult<i64> {
        let n = self.read_integer()?;
        i64::try_from(n).or_else(|_| err(format!("integer {n} out of range")))
    }

    /// A non-negative integer that fits in u32.
    pub fn read_u32(&mut self) -> ReadResult<u32> {
        let n = self.read_integer()?;
        u32::try_from(n).or_else(|_| err(format!("integer {n} out of range for u32")))
    }

    /// A non-negative integer that fits in u64.
    pub fn read_u64(&mut self) -> ReadResult<u64> {
        let n = self.read_integer()?;
        u64::try_from(n).or_else(|_| err(format!("integer {n} out of range for u64")))
    }

    /// A number as f64: a float of either width, or an integer (msgpack
    /// writers send `0.0` and `0` alike for a float field).
    pub fn read_f64(&mut self) -> ReadResult<f64> {
        match self.peek_marker()? {
            Marker::F32 => {
                self.pos += 1;
                Ok(f64::from(f32::from_bits(self.be(4)? as u32)))
            }
            Marker::F64 => {
                self.pos += 1;
                Ok(f64::from_bits(self.be(8)?))
            }
            _ => self.read_integer().map(|n| n as f64),
        }
    }

    /// A UTF-8 string, borrowed.
    pub fn read_str(&mut self) -> ReadResult<&'a str> {
        let len = match self.peek_marker()? {
            Marker::FixStr(n) => {
                self.pos += 1;
                n as usize
            }
            Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                let width = match self.peek_marker()? {
                    Marker::Str8 => 1,
                    Marker::Str16 => 2,
                    _ => 4,
                };
                self.pos += 1;
                self.be(width)? as usize
            }
            other => return err(format!("expected a string, got {other:?}")),
        };
        std::str::from_utf8(self.take(len)?).or_else(|_| err("string is not UTF-8"))
    }

    /// True when the next value is an extension (any type code).
    pub fn next_is_ext(&self) -> bool {
        matches!(
            self.peek_marker(),
            Ok(Marker::FixExt1
                | Marker::FixExt2
                | Marker::FixExt4
                | Marker::FixExt8
                | Marker::FixExt16
                | Marker::Ext8
                | Marker::Ext16
                | Marker::Ext32)
        )
    }

    /// An extension value: its type code and its bytes, borrowed.
    pub fn read_ext(&mut self) -> ReadResult<(i8, &'a [u8])> {
        let len = match self.peek_marker()? {
            Marker::FixExt1 => 1,
            Marker::FixExt2 => 2,
            Marker::FixExt4 => 4,
            Marker::FixExt8 => 8,
            Marker::FixExt16 => 16,
            Marker::Ext8 | Marker::Ext16 | Marker::Ext32 => {
                let width = match self.peek_marker()? {
                    Marker::Ext8 => 1,
                    Marker::Ext16 => 2,
                    _ => 4,
                };
                self.pos += 1;
                let len = self.be(width)? as usize;
                let kind = self.take(1)?[0] as i8;
                return Ok((kind, self.take(len)?));
            }
            other => return err(format!("expected an extension, got {other:?}")),
        };
        self.pos += 1;
        let kind = self.take(1)?[0] as i8;
        Ok((kind, self.take(len)?))
    }

    /// Skips one value of any kind.
    pub fn skip(&mut self) -> ReadResult<()> {
        self.skip_at_depth(0)
    }

    fn skip_at_depth(&mut self, depth: usize) -> ReadResult<()> {
        if depth > MAX_DEPTH {
            return err("nested too deeply");
        }
        let marker = self.peek_marker()?;
        self.pos += 1;
        let (fixed, len_width, items): (usize, usize, usize) = match marker {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => (0, 0, 0),
            Marker::Reserved => return err("reserved marker 0xc1"),
            Marker::U8 | Marker::I8 => (1, 0, 0),
            Marker::U16 | Marker::I16 => (2, 0, 0),
            Marker::U32 | Marker::I32 | Marker::F32 => (4, 0, 0),
            Marker::U64 | Marker::I64 | Marker::F64 => (8, 0, 0),
            Marker::FixStr(n) => (n as usize, 0, 0),
            Marker::Str8 | Marker::Bin8 => (0, 1, 0),
            Marker::Str16 | Marker::Bin16 => (0, 2, 0),
            Marker::Str32 | Marker::Bin32 => (0, 4, 0),
            Marker::FixExt1 => (2, 0, 0),
            Marker::FixExt2 => (3, 0, 0),
            Marker::FixExt4 => (5, 0, 0),
            Marker::FixExt8 => (9, 0, 0),
            Marker::FixExt16 => (17, 0, 0),
            Marker::Ext8 | Marker::Ext16 | Marker::Ext32 => {
                let width = match marker {
                    Marker::Ext8 => 1,
                    Marker::Ext16 => 2,
                    _ => 4,
                };
                let len = self.be(width)? as usize;
                self.take(len + 1)?;
                return Ok(());
            }
            Marker::FixArray(n) => (0, 0, n as usize),
            Marker::FixMap(n) => (0, 0, 2 * n as usize),
            Marker::Array16 | Marker::Array32 | Marker::Map16 | Marker::Map32 => {
                let width = if matches!(marker, Marker::Array16 | Marker::Map16) { 2 } else { 4 };
                let n = self.be(width)? as usize;
                let per_entry = if matches!(marker, Marker::Map16 | Marker::Map32) { 2 } else { 1 };
                (0, 0, n.saturating_mul(per_entry))
            }
        };
        if len_width > 0 {
            let len = self.be(len_width)? as usize;
            self.take(len)?;
        } else {
            self.take(fixed)?;
        }
        for _ in 0..items {
            self.skip_at_depth(depth + 1)?;
        }
        Ok(())
    }

    /// The encoded bytes of the next value, which is skipped.
    pub fn read_raw(&mut self) -> ReadResult<&'a [u8]> {
        let start = self.pos;
        self.skip()?;
        Ok(&self.buf[start..self.pos])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_integer_width() {
        let bytes = [
            0x05, 0xff, 0xcc, 0xc8, 0xcd, 0x01, 0x2c, 0xd0, 0x80, 0xd1, 0xff, 0x00, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff,
            0xff, 0xff, 0xff,
        ];
        let mut c = Cursor::new(&bytes);
        assert_eq!(c.read_i64().unwrap(), 5);
        assert_eq!(c.read_i64().unwrap(), -1);
        assert_eq!(c.read_u32().unwrap(), 200);
        assert_eq!(c.read_u32().unwrap(), 300);
        assert_eq!(c.read_i64().unwrap(), -128);
        assert_eq!(c.read_i64().unwrap(), -256);
        assert!(c.read_i64().is_err(), "u64::MAX does not fit in i64");
    }

    #[test]
    fn reads_strings_and_containers() {
        // ["ab", {"k": nil}]
        let bytes = [0x92, 0xa2, b'a', b'b', 0x81, 0xa1, b'k', 0xc0];
        let mut c = Cursor::new(&bytes);
        assert_eq!(c.read_array_len().unwrap(), 2);
        assert!(c.next_is_str());
        assert_eq!(c.read_str().unwrap(), "ab");
        assert_eq!(c.read_map_len().unwrap(), 1);
        assert_eq!(c.read_str().unwrap(), "k");
        assert!(c.read_nil().unwrap());
        assert_eq!(c.remaining(), 0);
    }

    #[test]
    fn skips_nested_values_and_ext() {
        // [[1, 2.5, "x", bin8(2), fixext1], {"a": [true]}] then 7
        let bytes = [
            0x92, 0x95, 0x01, 0xcb, 0x40, 0x04, 0, 0, 0, 0, 0, 0, 0xa1, b'x', 0xc4, 0x02, 1, 2, 0xd4, 0x01, 0x09, 0x81,
            0xa1, b'a', 0x91, 0xc3, 0x07,
        ];
        let mut c = Cursor::new(&bytes);
        let raw = c.read_raw().unwrap();
        assert_eq!(raw.len(), bytes.len() - 1);
        assert_eq!(c.read_i64().unwrap(), 7);
    }

    #[test]
    fn reads_fixed_and_sized_extensions() {
        // fixext4 type 3 [1,2,3,4], ext8 of 3 bytes type 3, then a truncated ext8
        let bytes = [0xd6, 0x03, 1, 2, 3, 4, 0xc7, 0x03, 0x03, 9, 8, 7];
        let mut c = Cursor::new(&bytes);
        assert!(c.next_is_ext());
        assert_eq!(c.read_ext().unwrap(), (3, &[1u8, 2, 3, 4][..]));
        assert_eq!(c.read_ext().unwrap(), (3, &[9u8, 8, 7][..]));
        assert!(Cursor::new(&[0xc7, 0x05, 0x03, 1]).read_ext().is_err());
        assert!(Cursor::new(&[0x01]).read_ext().is_err());
    }

    #[test]
    fn truncated_and_hostile_input_errors_instead_of_panicking() {
        for bytes in [
            &[0xdd, 0xff, 0xff, 0xff, 0xff][..],
            &[0xa5, b'a'],
            &[0xcd, 0x01],
            &[0xc1],
            &[0xdb, 0xff, 0xff, 0xff, 0xff],
        ] {
            assert!(Cursor::new(bytes).skip().is_err(), "{bytes:x?}");
        }
        let deep = vec![0x91u8; 1000];
        assert!(Cursor::new(&deep).skip().is_err());
    }
}
