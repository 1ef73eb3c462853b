//! Random hex ids for requests (not cryptographic; unique enough to never collide in practice).

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

thread_local! {
    static STATE: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.write_u64(std::process::id() as u64);
    hasher.finish() | 1
}

/// The next 64 random bits (splitmix64 over a per-thread state seeded from the OS).
fn next_u64() -> u64 {
    STATE.with(|state| {
        let mut z = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        state.set(z);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// `digits` random lowercase hex digits (at most 32).
pub fn random_hex(digits: usize) -> String {
    let value = (u128::from(next_u64()) << 64) | u128::from(next_u64());
    format!("{value:032x}")[..digits.min(32)].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_hex_and_distinct() {
        let a = random_hex(32);
        let b = random_hex(32);
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert_eq!(random_hex(8).len(), 8);
    }
}
