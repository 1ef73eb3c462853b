//! Closing a partial JSON text, the way vLLM's streaming parsers complete
//! partial tool calls (`partial_json_parser`): the open string is closed and the open brackets with
//! it; when that does not parse (a dangling key, a half number), the text is
//! cut back to before the last element and closed there.

/// The ways to close the JSON `text`, best first.
fn completions(text: &str) -> Vec<String> {
    let mut stack: Vec<char> = Vec::new();
    // Byte offsets where an element may be cut off, with the closers needed there.
    let mut cuts: Vec<(usize, String)> = Vec::new();
    let mut quote: Option<char> = None;
    let mut escape = false;
    let mut string_start = 0;
    for (i, c) in text.char_indices() {
        if let Some(q) = quote {
            if escape {
                escape = false;
            } else if c == '\\' {
                escape = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' => {
                quote = Some('"');
                string_start = i;
            }
            '{' => {
                stack.push('}');
                cuts.push((i + 1, closers(&stack)));
            }
            '[' => {
                stack.push(']');
                cuts.push((i + 1, closers(&stack)));
            }
            '}' | ']' if stack.last() == Some(&c) => {
                stack.pop();
            }
            ',' => cuts.push((i, closers(&stack))),
            _ => {}
        }
    }
    let mut out = Vec::new();
    match quote {
        Some(q) => {
            let mut body = text;
            if escape {
                body = &body[..body.len() - 1];
            } else if let Some(at) = unfinished_unicode_escape(&text[string_start..]) {
                body = &body[..string_start + at];
            }
            out.push(format!("{body}{q}{}", closers(&stack)));
        }
        None => {
            let trimmed = text.trim_end();
            let trimmed = trimmed.strip_suffix(',').unwrap_or(trimmed);
            out.push(format!("{trimmed}{}", closers(&stack)));
        }
    }
    for (at, close) in cuts.iter().rev().take(3) {
        out.push(format!("{}{close}", text[..*at].trim_end()));
    }
    out
}

/// The closers for an open-bracket stack, innermost first.
fn closers(stack: &[char]) -> String {
    stack.iter().rev().collect()
}

/// Where a `\u` escape that lacks hex digits begins in `string` (from its quote).
fn unfinished_unicode_escape(string: &str) -> Option<usize> {
    let at = string.rfind("\\u")?;
    let digits = &string[at + 2..];
    (digits.len() < 4 && digits.chars().all(|c| c.is_ascii_hexdigit())).then_some(at)
}

/// `text` parsed as partial JSON: the first completion that parses.
pub(crate) fn parse_partial_json(text: &str) -> Option<serde_json::Value> {
    completions(text).into_iter().find_map(|candidate| serde_json::from_str(&candidate).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn partial_json_closes_strings_and_drops_dangling_parts() {
        assert_eq!(parse_partial_json(r#"{"a": "Pa"#), Some(json!({"a": "Pa"})));
        assert_eq!(parse_partial_json(r#"{"a": 1, "b"#), Some(json!({"a": 1})));
        assert_eq!(parse_partial_json(r#"{"a": [1, 2"#), Some(json!({"a": [1, 2]})));
        assert_eq!(parse_partial_json(r#"{"a": "x\"#), Some(json!({"a": "x"})));
        assert_eq!(parse_partial_json(r#"{"a": "x\u00"#), Some(json!({"a": "x"})));
        assert_eq!(parse_partial_json(r#"{"a": tr"#), Some(json!({})));
        assert_eq!(parse_partial_json("{"), Some(json!({})));
    }
}
