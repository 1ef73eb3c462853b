//! A parser for the Python that `pythonic` tool calls are written in: a list
//! of calls, `[f(a=1), g.h(b='x')]`, whose keyword values are literals.
//!
//! vLLM parses the text with Python's own `ast` and converts the literal
//! nodes (`get_parameter_value`). No maintained crate parses just Python
//! literals, and a full Python parser (RustPython's, ruff's) would bring a
//! large generated grammar into the build for a few dozen lines of syntax; so
//! this is a small recursive-descent parser of exactly that subset: strings
//! (quotes, triple quotes, prefixes `r`, `u`, `f` without placeholders,
//! adjacent ones joined, escapes), numbers (with `_`, hex/octal/binary,
//! floats, a sign), `True`/`False`/`None` and JSON's `true`/`false`/`null`,
//! lists, tuples and sets (as JSON lists) and dicts with literal keys.
//! Positional arguments are read and ignored, as vLLM ignores them.

use serde_json::{Map, Number, Value};

/// A call: dotted name and keyword arguments, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PyCall {
    pub name: String,
    pub keywords: Map<String, Value>,
}

/// Why the text is not a list of calls with literal arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a pythonic tool call list at byte {at}: {what}")]
pub(crate) struct PyError {
    at: usize,
    what: &'static str,
}

/// Parses `text`, a whole Python module that must be one list of calls.
pub(crate) fn parse_call_list(text: &str) -> Result<Vec<PyCall>, PyError> {
    parse(text, true)
}

/// As [`parse_call_list`], but a set literal is an error: in a partial text
/// closed by streaming, `{'a'}` is a dict whose key is still being written.
pub(crate) fn parse_call_list_without_sets(text: &str) -> Result<Vec<PyCall>, PyError> {
    parse(text, false)
}

fn parse(text: &str, allow_sets: bool) -> Result<Vec<PyCall>, PyError> {
    let mut p = Parser { s: text, i: 0, depth: 0, allow_sets };
    p.skip_module_space();
    let calls = p.call_list()?;
    p.skip_module_space();
    if p.i < p.s.len() {
        return p.err("text after the list");
    }
    Ok(calls)
}

struct Parser<'a> {
    s: &'a str,
    i: usize,
    depth: usize,
    allow_sets: bool,
}

/// Deeper nesting than this is refused (Python's own parser has a limit too).
const MAX_DEPTH: usize = 200;

impl<'a> Parser<'a> {
    fn err<T>(&self, what: &'static str) -> Result<T, PyError> {
        Err(PyError { at: self.i, what })
    }

    fn rest(&self) -> &'a str {
        &self.s[self.i..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    /// Space between tokens inside brackets: newlines, comments and line
    /// continuations included.
    fn skip_space(&mut self) {
        loop {
            let rest = self.rest();
            if let Some(c) = rest.chars().next().filter(|c| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c')) {
                self.i += c.len_utf8();
            } else if rest.starts_with("\\\n") {
                self.i += 2;
            } else if rest.starts_with("\\\r\n") {
                self.i += 3;
            } else if rest.starts_with('#') {
                self.i += rest.find('\n').unwrap_or(rest.len());
            } else {
                return;
            }
        }
    }

    /// Space around the statement: the same, since a module may have blank
    /// lines and comments around its one expression.
    fn skip_module_space(&mut self) {
        self.skip_space();
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.i += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char, what: &'static str) -> Result<(), PyError> {
        self.skip_space();
        if self.eat(c) {
            Ok(())
        } else {
            self.err(what)
        }
    }

    fn identifier(&mut self) -> Option<&'a str> {
        let rest = self.rest();
        let mut chars = rest.char_indices();
        let (_, first) = chars.next()?;
        if !(first == '_' || first.is_alphabetic()) {
            return None;
        }
        let end = chars.find(|(_, c)| !(*c == '_' || c.is_alphanumeric())).map(|(i, _)| i).unwrap_or(rest.len());
        self.i += end;
        Some(&rest[..end])
    }

    fn dotted_name(&mut self) -> Result<String, PyError> {
        let mut name = match self.identifier() {
            Some(id) => id.to_owned(),
            None => return self.err("a function name"),
        };
        loop {
            let save = self.i;
            self.skip_space();
            if !self.eat('.') {
                self.i = save;
                return Ok(name);
            }
            self.skip_space();
            match self.identifier() {
                Some(id) => {
                    name.push('.');
                    name.push_str(id);
                }
                None => return self.err("a name after '.'"),
            }
        }
    }

    fn call_list(&mut self) -> Result<Vec<PyCall>, PyError> {
        self.expect('[', "'['")?;
        let mut calls = Vec::new();
        loop {
            self.skip_space();
            if self.eat(']') {
                return Ok(calls);
            }
            calls.push(self.call()?);
            self.skip_space();
            if self.eat(',') {
                continue;
            }
            self.expect(']', "',' or ']'")?;
            return Ok(calls);
        }
    }

    fn call(&mut self) -> Result<PyCall, PyError> {
        let name = self.dotted_name()?;
        self.expect('(', "'(' after the function name")?;
        let mut keywords = Map::new();
        loop {
            self.skip_space();
            if self.eat(')') {
                return Ok(PyCall { name, keywords });
            }
            let save = self.i;
            let keyword = self.identifier().map(str::to_owned);
            self.skip_space();
            match keyword {
                Some(key) if self.peek() == Some('=') && !self.rest().starts_with("==") => {
                    self.i += 1;
                    self.skip_space();
                    let value = self.value()?;
                    keywords.insert(key, value);
                }
                _ => {
                    // A positional argument: parsed, then dropped (as vLLM).
                    self.i = save;
                    self.positional()?;
                }
            }
            self.skip_space();
            if self.eat(',') {
                continue;
            }
            self.expect(')', "',' or ')'")?;
            return Ok(PyCall { name, keywords });
        }
    }

    fn positional(&mut self) -> Result<(), PyError> {
        if self.peek().is_some_and(|c| c == '_' || c.is_alphabetic()) && !self.at_string_prefix() {
            self.dotted_name().map(drop)
        } else {
            self.value().map(drop)
        }
    }

    fn at_string_prefix(&self) -> bool {
        let rest = self.rest();
        let prefix_len = rest.find(['\'', '"']).unwrap_or(usize::MAX);
        prefix_len <= 2 && rest[..prefix_len].chars().all(|c| matches!(c.to_ascii_lowercase(), 'r' | 'u' | 'f' | 'b'))
    }

    fn value(&mut self) -> Result<Value, PyError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.err("nesting too deep");
        }
        let value = self.value_inner();
        self.depth -= 1;
        value
    }

    fn value_inner(&mut self) -> Result<Value, PyError> {
        self.skip_space();
        match self.peek() {
            None => self.err("a value"),
            Some('[') => {
                self.i += 1;
                Ok(Value::Array(self.elements(']')?))
            }
            Some('(') => {
                self.i += 1;
                self.paren()
            }
            Some('{') => {
                self.i += 1;
                self.brace()
            }
            Some('-' | '+') => {
                let negative = self.peek() == Some('-');
                self.i += 1;
                self.skip_space();
                match self.value()? {
                    Value::Number(n) => Ok(negate(n, negative)),
                    _ => self.err("a number after a sign"),
                }
            }
            Some(c) if c.is_ascii_digit() || c == '.' => self.number(),
            Some(_) if self.at_string_prefix() => self.strings(),
            Some(_) => match self.identifier() {
                Some("True" | "true") => Ok(Value::Bool(true)),
                Some("False" | "false") => Ok(Value::Bool(false)),
                Some("None" | "null") => Ok(Value::Null),
                _ => self.err("a literal"),
            },
        }
    }

    fn elements(&mut self, close: char) -> Result<Vec<Value>, PyError> {
        let mut items = Vec::new();
        loop {
            self.skip_space();
            if self.eat(close) {
                return Ok(items);
            }
            items.push(self.value()?);
            self.skip_space();
            if self.eat(',') {
                continue;
            }
            self.expect(close, "',' or a closing bracket")?;
            return Ok(items);
        }
    }

    /// `(x)` is x; `()`, `(x,)` and `(x, y)` are tuples (JSON lists).
    fn paren(&mut self) -> Result<Value, PyError> {
        self.skip_space();
        if self.eat(')') {
            return Ok(Value::Array(Vec::new()));
        }
        let first = self.value()?;
        self.skip_space();
        if self.eat(')') {
            return Ok(first);
        }
        self.expect(',', "',' or ')'")?;
        let mut items = vec![first];
        items.extend(self.elements(')')?);
        Ok(Value::Array(items))
    }

    /// `{}` and `{k: v}` are dicts, `{a, b}` a set (a JSON list).
    fn brace(&mut self) -> Result<Value, PyError> {
        self.skip_space();
        if self.eat('}') {
            return Ok(Value::Object(Map::new()));
        }
        let first = self.value()?;
        self.skip_space();
        if !self.eat(':') {
            if !self.allow_sets {
                return self.err("a dict (a set here is a partial dict)");
            }
            let mut items = vec![first];
            if !self.eat('}') {
                self.expect(',', "',' or '}'")?;
                items.extend(self.elements('}')?);
            }
            return Ok(Value::Array(items));
        }
        let mut map = Map::new();
        let mut key = first;
        loop {
            let value = self.value()?;
            map.insert(self.key_string(key)?, value);
            self.skip_space();
            if self.eat('}') {
                return Ok(Value::Object(map));
            }
            self.expect(',', "',' or '}'")?;
            self.skip_space();
            if self.eat('}') {
                return Ok(Value::Object(map));
            }
            key = self.value()?;
            self.expect(':', "':' in a dict")?;
        }
    }

    /// A dict key as `json.dumps` writes it.
    fn key_string(&self, key: Value) -> Result<String, PyError> {
        match key {
            Value::String(s) => Ok(s),
            Value::Null => Ok("null".into()),
            Value::Bool(b) => Ok(b.to_string()),
            Value::Number(n) => Ok(n.to_string()),
            _ => self.err("a literal dict key"),
        }
    }

    fn number(&mut self) -> Result<Value, PyError> {
        let rest = self.rest();
        let end = rest
            .char_indices()
            .find(|&(i, c)| {
                !(c.is_ascii_alphanumeric()
                    || c == '_'
                    || c == '.'
                    || ((c == '+' || c == '-')
                        && i > 0
                        && matches!(rest.as_bytes()[i - 1], b'e' | b'E')
                        && !rest[..i].starts_with("0x")
                        && !rest[..i].starts_with("0X")))
            })
            .map(|(i, _)| i)
            .unwrap_or(rest.len());
        let token = &rest[..end];
        self.i += end;
        let digits: String = token.chars().filter(|&c| c != '_').collect();
        if token.contains("__") || token.ends_with('_') {
            return self.err("a number");
        }
        let lower = digits.to_ascii_lowercase();
        let radix = match lower.get(..2) {
            Some("0x") => Some(16),
            Some("0o") => Some(8),
            Some("0b") => Some(2),
            _ => None,
        };
        if let Some(radix) = radix {
            return match u64::from_str_radix(&lower[2..], radix) {
                Ok(n) => Ok(Value::Number(n.into())),
                Err(_) => self.err("a number"),
            };
        }
        if lower.contains(['.', 'e']) {
            if lower.ends_with('j') {
                return self.err("a JSON number (complex numbers are not)");
            }
            return match lower.parse::<f64>() {
                Ok(f) if f.is_finite() => Ok(Number::from_f64(f).map_or(Value::Null, Value::Number)),
                _ => self.err("a finite number"),
            };
        }
        // Python refuses leading zeros in a decimal integer ("0" and "00" aside).
        if lower.len() > 1 && lower.starts_with('0') && lower.chars().any(|c| c != '0') {
            return self.err("a number");
        }
        if let Ok(n) = lower.parse::<u64>() {
            return Ok(Value::Number(n.into()));
        }
        match lower.parse::<f64>() {
            // An integer past 64 bits: kept as the nearest float.
            Ok(f) if f.is_finite() && lower.chars().all(|c| c.is_ascii_digit()) => {
                Ok(Number::from_f64(f).map_or(Value::Null, Value::Number))
            }
            _ => self.err("a number"),
        }
    }

    /// One or more adjacent string literals, joined.
    fn strings(&mut self) -> Result<Value, PyError> {
        let mut out = String::new();
        loop {
            out.push_str(&self.string()?);
            let save = self.i;
            self.skip_space();
            if !(self.peek().is_some_and(|c| c == '\'' || c == '"')
                || self.at_string_prefix() && self.peek().is_some_and(char::is_alphabetic))
            {
                self.i = save;
                return Ok(Value::String(out));
            }
        }
    }

    fn string(&mut self) -> Result<String, PyError> {
        let rest = self.rest();
        let quote_at = rest.find(['\'', '"']).unwrap_or(0);
        let prefix = rest[..quote_at].to_ascii_lowercase();
        if prefix.contains('b') {
            return self.err("a str (bytes are not JSON)");
        }
        let raw = prefix.contains('r');
        let fstring = prefix.contains('f');
        self.i += quote_at;
        let rest = self.rest();
        let q = &rest[..1];
        let triple = rest.starts_with(&q.repeat(3));
        let delim = if triple { q.repeat(3) } else { q.to_owned() };
        self.i += delim.len();
        let mut out = String::new();
        loop {
            let rest = self.rest();
            let Some(c) = rest.chars().next() else { return self.err("a closing quote") };
            if rest.starts_with(delim.as_str()) {
                self.i += delim.len();
                break;
            }
            if (c == '\n' || c == '\r') && !triple {
                return self.err("a closing quote before the line ends");
            }
            if c == '\\' {
                let Some(next) = rest[1..].chars().next() else { return self.err("an escape") };
                if raw {
                    out.push('\\');
                    out.push(next);
                    self.i += 1 + next.len_utf8();
                    continue;
                }
                self.i += 1 + next.len_utf8();
                match next {
                    '\n' => {}
                    '\\' => out.push('\\'),
                    '\'' => out.push('\''),
                    '"' => out.push('"'),
                    'a' => out.push('\x07'),
                    'b' => out.push('\x08'),
                    'f' => out.push('\x0c'),
                    'n' => out.push('\n'),
                    'r' => out.push('\r'),
                    't' => out.push('\t'),
                    'v' => out.push('\x0b'),
                    'x' => out.push(self.hex_escape(2)?),
                    'u' => out.push(self.hex_escape(4)?),
                    'U' => out.push(self.hex_escape(8)?),
                    '0'..='7' => {
                        let mut value = next.to_digit(8).unwrap_or(0);
                        for _ in 0..2 {
                            match self.peek().and_then(|c| c.to_digit(8)) {
                                Some(d) => {
                                    value = value * 8 + d;
                                    self.i += 1;
                                }
                                None => break,
                            }
                        }
                        match char::from_u32(value) {
                            Some(ch) => out.push(ch),
                            None => return self.err("an octal escape"),
                        }
                    }
                    other => {
                        out.push('\\');
                        out.push(other);
                    }
                }
                continue;
            }
            out.push(c);
            self.i += c.len_utf8();
        }
        if fstring {
            return unescape_fstring(&out).ok_or(PyError { at: self.i, what: "an f-string without placeholders" });
        }
        Ok(out)
    }

    fn hex_escape(&mut self, digits: usize) -> Result<char, PyError> {
        let rest = self.rest();
        let hex = rest.get(..digits).filter(|h| h.chars().all(|c| c.is_ascii_hexdigit()));
        let Some(hex) = hex else { return self.err("hex digits in an escape") };
        self.i += digits;
        u32::from_str_radix(hex, 16).ok().and_then(char::from_u32).map_or_else(|| self.err("a code point"), Ok)
    }
}

/// An f-string's text when it has no placeholder (`{{`/`}}` are braces).
fn unescape_fstring(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '{' || c == '}' {
            if chars.peek() == Some(&c) {
                chars.next();
            } else {
                return None;
            }
        }
        out.push(c);
    }
    Some(out)
}

fn negate(n: Number, negative: bool) -> Value {
    if !negative {
        return Value::Number(n);
    }
    if let Some(u) = n.as_u64() {
        if let Some(i) = 0i64.checked_sub_unsigned(u) {
            return Value::Number(i.into());
        }
    }
    if let Some(i) = n.as_i64().and_then(i64::checked_neg) {
        return Value::Number(i.into());
    }
    Number::from_f64(-n.as_f64().unwrap_or(0.0)).map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(text: &str) -> (String, Value) {
        let calls = parse_call_list(text).unwrap();
        assert_eq!(calls.len(), 1);
        (calls[0].name.clone(), Value::Object(calls[0].keywords.clone()))
    }

    #[test]
    fn literals_convert_as_vllm_converts_them() {
        let (name, args) = one("[a.b(s='x\\n\\'y\\'', t=\"\"\"tri\nple\"\"\", n=-1_000, f=2.5e1, h=0x1F, \
             l=[1, (2, 3), {4}], d={'k': None, 1: True}, j=true, z=null, r=r'\\d', ff=f'{{x}}')]");
        assert_eq!(name, "a.b");
        assert_eq!(
            args,
            json!({"s": "x\n'y'", "t": "tri\nple", "n": -1000, "f": 25.0, "h": 31,
                   "l": [1, [2, 3], [4]], "d": {"k": null, "1": true}, "j": true, "z": null,
                   "r": "\\d", "ff": "{x}"})
        );
    }

    #[test]
    fn positional_arguments_are_dropped() {
        assert_eq!(one("[f(1, x, y=2)]").1, json!({"y": 2}));
    }

    #[test]
    fn what_python_refuses_is_an_error() {
        for bad in [
            "[f(x=)]",
            "[f(x='a\nb')]",
            "[f(x=b'a')]",
            "[f(x=y)]",
            "[f(x=f'{y}')]",
            "[f(x=1)] trailing",
            "[1]",
            "[f(x=01)]",
        ] {
            assert!(parse_call_list(bad).is_err(), "{bad}");
        }
    }
}
