//! Token ids of one engine output, stored inline when there are few (the
//! usual one per step), so the hot path allocates nothing per output.

/// How many ids are stored without a heap allocation.
const INLINE: usize = 6;

/// A short list of token ids.
#[derive(Clone, PartialEq, Eq)]
pub enum TokenIds {
    /// Up to `INLINE` ids in place.
    Inline {
        /// How many of `ids` are used.
        len: u8,
        /// The ids; only the first `len` count.
        ids: [u32; INLINE],
    },
    /// More ids, on the heap.
    Heap(Vec<u32>),
}

impl Default for TokenIds {
    fn default() -> Self {
        TokenIds::Inline { len: 0, ids: [0; INLINE] }
    }
}

impl TokenIds {
    /// Room for `capacity` ids.
    pub fn with_capacity(capacity: usize) -> Self {
        if capacity <= INLINE {
            TokenIds::default()
        } else {
            TokenIds::Heap(Vec::with_capacity(capacity))
        }
    }

    /// Appends `id`.
    pub fn push(&mut self, id: u32) {
        match self {
            TokenIds::Inline { len, ids } if (*len as usize) < INLINE => {
                ids[*len as usize] = id;
                *len += 1;
            }
            TokenIds::Inline { len, ids } => {
                let mut heap = ids[..*len as usize].to_vec();
                heap.push(id);
                *self = TokenIds::Heap(heap);
            }
            TokenIds::Heap(v) => v.push(id),
        }
    }

    /// The ids.
    pub fn as_slice(&self) -> &[u32] {
        match self {
            TokenIds::Inline { len, ids } => &ids[..*len as usize],
            TokenIds::Heap(v) => v,
        }
    }

    /// How many ids.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Debug for TokenIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_slice().fmt(f)
    }
}

impl From<Vec<u32>> for TokenIds {
    fn from(ids: Vec<u32>) -> Self {
        let mut out = TokenIds::with_capacity(ids.len());
        for id in ids {
            out.push(id);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_from_inline_to_heap() {
        let mut t = TokenIds::default();
        for i in 0..10 {
            t.push(i);
        }
        assert_eq!(t.as_slice(), (0..10).collect::<Vec<_>>().as_slice());
        assert!(matches!(t, TokenIds::Heap(_)));
        let short = TokenIds::from(vec![1, 2]);
        assert!(matches!(short, TokenIds::Inline { len: 2, .. }));
        assert_eq!(short.len(), 2);
    }
}
