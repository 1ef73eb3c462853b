//! Tool call ids as vLLM makes them.

/// 64 random bits from the OS.
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // The OS generator only fails on a broken system; ids must still be made.
    getrandom::fill(&mut bytes).expect("the OS random number generator failed");
    u64::from_le_bytes(bytes)
}

/// `chatcmpl-tool-` + 16 lowercase hex digits (vLLM's `make_tool_call_id`).
pub(crate) fn chatcmpl_tool_id() -> String {
    format!("chatcmpl-tool-{:016x}", random_u64())
}

/// 9 letters and digits (Mistral's tool call ids).
pub(crate) fn mistral_tool_id() -> String {
    const ALPHANUMERIC: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut bits = random_u64();
    (0..9)
        .map(|_| {
            // 62 symbols from 6 bits each would bias; 64 bits give 9 draws of
            // a uniform value modulo 62 with a negligible bias.
            let c = ALPHANUMERIC[(bits % 62) as usize] as char;
            bits /= 62;
            c
        })
        .collect()
}

/// Which id a parser's calls get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdKind {
    /// `chatcmpl-tool-...`
    Chatcmpl,
    /// Mistral's 9 alphanumerics.
    Mistral,
}

impl IdKind {
    /// A fresh id of this kind.
    pub(crate) fn make(self) -> String {
        match self {
            IdKind::Chatcmpl => chatcmpl_tool_id(),
            IdKind::Mistral => mistral_tool_id(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_vllms_shapes() {
        let id = chatcmpl_tool_id();
        assert_eq!(id.len(), "chatcmpl-tool-".len() + 16);
        assert!(id["chatcmpl-tool-".len()..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(chatcmpl_tool_id(), chatcmpl_tool_id());
        let id = mistral_tool_id();
        assert_eq!(id.len(), 9);
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
