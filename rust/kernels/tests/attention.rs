//! Decode attention over a paged cache against a float64 reference that
//! gathers each sequence's keys and values by slot, for both paths, random
//! shapes (grouped and ungrouped heads, head sizes that are and are not
//! whole vectors), scattered slots and 1 to 4 threads; and the checks that
//! refuse a bad call before anything is read.

mod common;

use common::{paths, Rng};
use proptest::prelude::*;
use vllm_rs_kernels::{
    decode_attention, f32_to_bf16, f32_to_f16, AttentionDims, AttentionError, DecodeInputs, KvCache, Path,
};

/// A call's operands: the caches filled at random, each sequence's keys at
/// random distinct slots, its row every other token (so rows are skipped).
struct Case {
    dims: AttentionDims,
    q: Vec<f32>,
    keys: Vec<f32>,
    values: Vec<f32>,
    /// A 16-bit cache's bits (`half`), when the case has one.
    key_bits: Vec<u16>,
    value_bits: Vec<u16>,
    half: Option<Half>,
    rows: Vec<i64>,
    key_slots: Vec<i64>,
    key_starts: Vec<i64>,
    lens: Vec<i64>,
    scale: f32,
}

impl Case {
    fn new(seqs: usize, kv_heads: usize, group: usize, head_dim: usize, max_keys: usize, seed: u64) -> Case {
        let mut rng = Rng(seed);
        let (heads, tokens, slots) = (kv_heads * group, 2 * seqs + 1, max_keys * seqs + 7);
        let mut floats = |n: usize| (0..n).map(|_| rng.float()).collect::<Vec<f32>>();
        let q = floats(tokens * heads * head_dim);
        let keys = floats(slots * kv_heads * head_dim);
        let values = floats(slots * kv_heads * head_dim);
        let mut free: Vec<i64> = (0..slots as i64).collect();
        let mut key_slots = vec![0i64; seqs * max_keys];
        let mut lens = Vec::new();
        for seq in 0..seqs {
            let len = 1 + rng.below(max_keys);
            for key in 0..len {
                key_slots[seq * max_keys + key] = free.swap_remove(rng.below(free.len()));
            }
            lens.push(len as i64);
        }
        let dims = AttentionDims { tokens, heads, kv_heads, head_dim, slots, seqs, max_keys };
        let rows = (0..seqs as i64).map(|s| 2 * s + 1).collect();
        let key_starts = (0..seqs).map(|s| (s * max_keys) as i64).collect();
        let scale = 1.0 / (head_dim as f32).sqrt();
        Case {
            dims,
            q,
            keys,
            values,
            key_bits: vec![],
            value_bits: vec![],
            half: None,
            rows,
            key_slots,
            key_starts,
            lens,
            scale,
        }
    }

    /// The case with its caches held in `half`: the float32 keys and values
    /// become the rounded ones, which the reference then uses.
    fn in_half(mut self, half: Half) -> Case {
        let (round, widen): (Round, Widen) = match half {
            Half::F16 => (f32_to_f16, |b| vllm_rs_kernels::dequantize_f16(b)),
            Half::Bf16 => (f32_to_bf16, |b| f32::from_bits(u32::from(b) << 16)),
        };
        self.key_bits = self.keys.iter().map(|&v| round(v)).collect();
        self.value_bits = self.values.iter().map(|&v| round(v)).collect();
        self.keys = self.key_bits.iter().map(|&b| widen(b)).collect();
        self.values = self.value_bits.iter().map(|&b| widen(b)).collect();
        self.half = Some(half);
        self
    }

    fn inputs(&self) -> DecodeInputs<'_> {
        DecodeInputs {
            q: &self.q,
            key_cache: match self.half {
                None => KvCache::F32(&self.keys),
                Some(Half::F16) => KvCache::F16(&self.key_bits),
                Some(Half::Bf16) => KvCache::Bf16(&self.key_bits),
            },
            value_cache: match self.half {
                None => KvCache::F32(&self.values),
                Some(Half::F16) => KvCache::F16(&self.value_bits),
                Some(Half::Bf16) => KvCache::Bf16(&self.value_bits),
            },
            rows: &self.rows,
            key_slots: &self.key_slots,
            key_starts: &self.key_starts,
            lens: &self.lens,
            scale: self.scale,
        }
    }

    fn run(&self, path: Path, threads: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.q.len()];
        decode_attention(path, &self.inputs(), &mut out, self.dims, threads).unwrap();
        out
    }

    /// Each sequence's keys and values gathered, softmax and sums in float64.
    fn reference(&self) -> Vec<f64> {
        let AttentionDims { heads, kv_heads, head_dim: hd, max_keys, .. } = self.dims;
        let mut out = vec![f64::NAN; self.q.len()];
        for (seq, &row) in self.rows.iter().enumerate() {
            let slots = &self.key_slots[seq * max_keys..seq * max_keys + self.lens[seq] as usize];
            for h in 0..heads {
                let at = (row as usize * heads + h) * hd;
                let kv = |slot: i64| (slot as usize * kv_heads + h / (heads / kv_heads)) * hd;
                let scores: Vec<f64> = slots
                    .iter()
                    .map(|&s| {
                        let dot: f64 =
                            (0..hd).map(|d| f64::from(self.q[at + d]) * f64::from(self.keys[kv(s) + d])).sum();
                        dot * f64::from(self.scale)
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for d in 0..hd {
                    let v: f64 = slots.iter().zip(&weights).map(|(&s, w)| w * f64::from(self.values[kv(s) + d])).sum();
                    out[at + d] = v / sum;
                }
            }
        }
        out
    }
}

/// The sequences' rows within float32 error of the reference (outputs are
/// averages of values in [-2, 2]), every other row untouched (NaN).
fn assert_close(got: &[f32], want: &[f64]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "element {i} is not a sequence's but was written: {g}");
        } else {
            assert!((f64::from(*g) - w).abs() <= 1e-5, "element {i}: {g} vs {w}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_path_equals_the_gathered_reference(
        seqs in 1usize..7,
        kv_heads in 1usize..4,
        group in 1usize..5,
        head_dim in prop::sample::select(vec![1usize, 8, 12, 16, 64]),
        max_keys in 1usize..40,
        threads in 1usize..5,
        seed in any::<u64>(),
    ) {
        let case = Case::new(seqs, kv_heads, group, head_dim, max_keys, seed);
        let want = case.reference();
        for path in paths() {
            assert_close(&case.run(path, threads), &want);
        }
    }
}

#[test]
fn smollm2_shapes_agree_and_threads_keep_the_bits() {
    // 16 sequences, 9 query heads over 3 key/value heads of 64, up to 200 keys.
    let case = Case::new(16, 3, 3, 64, 200, 5);
    let want = case.reference();
    for path in paths() {
        let one = case.run(path, 1);
        assert_close(&one, &want);
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let one = bits(one);
        for threads in [2, 3, 16, 40] {
            assert!(one == bits(case.run(path, threads)), "{path:?} on {threads} threads: other bits");
        }
    }
}

/// Float32 to a 16-bit type's bits, and back.
type Round = fn(f32) -> u16;
type Widen = fn(u16) -> f32;

/// A 16-bit cache type.
#[derive(Clone, Copy, Debug)]
enum Half {
    F16,
    Bf16,
}

#[test]
fn sixteen_bit_caches_are_read_as_their_float32_values() {
    for half in [Half::F16, Half::Bf16] {
        for head_dim in [8, 12, 64] {
            let case = Case::new(5, 3, 3, head_dim, 30, 11).in_half(half);
            let want = case.reference();
            for path in paths() {
                for threads in [1, 3] {
                    assert_close(&case.run(path, threads), &want);
                }
            }
        }
    }
}

#[test]
fn large_scores_do_not_overflow() {
    // Scores of about +-4e4: exp without the maximum subtracted overflows.
    let mut case = Case::new(2, 1, 2, 8, 9, 3);
    case.q.iter_mut().for_each(|x| *x *= 300.0);
    case.keys.iter_mut().for_each(|x| *x *= 300.0);
    let want = case.reference();
    for path in paths() {
        assert_close(&case.run(path, 1), &want);
    }
}

#[test]
fn bad_calls_are_refused_before_anything_is_read() {
    let case = Case::new(2, 1, 2, 8, 4, 9);
    let refuse = |edit: &dyn Fn(&mut Case)| {
        let mut bad = Case::new(2, 1, 2, 8, 4, 9);
        edit(&mut bad);
        let mut out = vec![0.0; bad.q.len()];
        decode_attention(Path::best(), &bad.inputs(), &mut out, bad.dims, 1).unwrap_err()
    };
    let slots = case.dims.slots;
    assert_eq!(
        refuse(&|c| c.key_slots[0] = slots as i64),
        AttentionError::Slot { seq: 0, key: 0, slot: slots as i64, slots }
    );
    assert_eq!(refuse(&|c| c.key_slots[0] = -1), AttentionError::Slot { seq: 0, key: 0, slot: -1, slots });
    assert_eq!(refuse(&|c| c.lens[1] = 0), AttentionError::Keys { seq: 1, len: 0, max_keys: 4 });
    assert_eq!(refuse(&|c| c.lens[1] = 5), AttentionError::Keys { seq: 1, len: 5, max_keys: 4 });
    assert_eq!(refuse(&|c| c.rows[1] = c.rows[0]), AttentionError::Row { seq: 1, row: 1, tokens: 5 });
    assert_eq!(refuse(&|c| c.rows[1] = 5), AttentionError::Row { seq: 1, row: 5, tokens: 5 });
    assert_eq!(refuse(&|c| c.dims.kv_heads = 3), AttentionError::Heads { heads: 2, kv_heads: 3 });
    assert_eq!(refuse(&|c| c.dims.head_dim = 0), AttentionError::HeadDim);
    assert_eq!(
        refuse(&|c| {
            c.values.pop();
        }),
        AttentionError::Len { what: "value_cache", got: 119, need: 120 }
    );
    assert_eq!(
        refuse(&|c| c.key_starts[1] = 8 - c.lens[1] + 1),
        AttentionError::KeyRange { seq: 1, start: 8 - case.lens[1] + 1, len: case.lens[1], available: 8 }
    );
    let err = refuse(&|c| c.key_starts[0] = -1);
    assert_eq!(err.to_string(), format!("sequence 0: keys -1..-1+{} are outside key_slots' 8 slots", case.lens[0]));
    let err = refuse(&|c| {
        c.key_starts.pop();
    });
    assert_eq!(err.to_string(), "key_starts has 1 elements, the shapes need 2");
}
