//! JSON text as Python's `json.dumps(value, ensure_ascii=False)` writes it
//! (`", "` and `": "` separators), which is how vLLM renders tool arguments.

use std::io;

use serde::Serialize;
use serde_json::ser::{Formatter, Serializer};
use serde_json::Value;

/// serde_json's compact formatter with Python's default separators.
struct PythonFormatter;

impl Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }
}

/// `value` as `json.dumps(value, ensure_ascii=False)` writes it (floats
/// aside: serde_json writes `1e20` where Python writes `1e+20`).
pub(crate) fn dumps(value: &Value) -> String {
    let mut out = Vec::new();
    let mut ser = Serializer::with_formatter(&mut out, PythonFormatter);
    // Serialising a Value into memory cannot fail.
    value.serialize(&mut ser).expect("serialising a JSON value into memory");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_and_unicode_are_pythons() {
        let v: Value = serde_json::from_str(r#"{"b":[1,2.5,null],"a":"Zürich\n"}"#).unwrap();
        assert_eq!(dumps(&v), r#"{"b": [1, 2.5, null], "a": "Zürich\n"}"#);
    }
}
