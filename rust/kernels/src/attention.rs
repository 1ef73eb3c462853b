//! Attention over a paged KV cache, read in place: each sequence has one
//! query (a decode step; a prefill's queries are one sequence each, over
//! the keys up to their own position), its keys and values are found
//! through its cache slots, and the query heads share key/value heads in groups
//! (grouped-query attention). Nothing is gathered: a key is read from the
//! cache where it lies, once per query head of its group.
//!
//! Per query head: the scores `q·k·scale` of every key, the softmax of them
//! (the maximum subtracted, `exp`, the sum), the values summed with those
//! weights and divided by the sum at the end. Float32 throughout, as torch's
//! `scaled_dot_product_attention` on the gathered keys, so the two agree to
//! float32 rounding (summation order and `exp`'s last bit differ).

use crate::kv_cache::KvCache;
use crate::{Out, Path};

/// A call whose buffers or indices do not match the shapes it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttentionError {
    /// The query heads are not whole groups of the key/value heads.
    #[error("heads = {heads} is not a positive multiple of kv_heads = {kv_heads}")]
    Heads {
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// The keys and values are held in different types.
    #[error("key_cache and value_cache must hold the same type")]
    CacheTypes,
    /// A head has no dimensions.
    #[error("head_dim must be positive")]
    HeadDim,
    /// A buffer's length is not what the shapes need.
    #[error("{what} has {got} elements, the shapes need {need}")]
    Len {
        /// Which buffer.
        what: &'static str,
        /// What it holds.
        got: usize,
        /// What the shapes need.
        need: usize,
    },
    /// A sequence's row is out of range or not after the previous one's.
    #[error("sequence {seq}: row {row} is not above the previous sequence's row and below tokens = {tokens}")]
    Row {
        /// The sequence.
        seq: usize,
        /// Its row.
        row: i64,
        /// Rows of `q` and `out`.
        tokens: usize,
    },
    /// A sequence's key count is not in `1..=max_keys`.
    #[error("sequence {seq}: {len} keys, not 1..={max_keys}")]
    Keys {
        /// The sequence.
        seq: usize,
        /// Its key count.
        len: i64,
        /// Columns of `key_slots`.
        max_keys: usize,
    },
    /// A sequence's keys run outside `key_slots`.
    #[error("sequence {seq}: keys {start}..{start}+{len} are outside key_slots' {available} slots")]
    KeyRange {
        /// The sequence.
        seq: usize,
        /// Its first key's index in `key_slots`.
        start: i64,
        /// Its key count.
        len: i64,
        /// Elements of `key_slots`.
        available: usize,
    },
    /// A key's slot is outside the cache.
    #[error("sequence {seq}: key {key} is slot {slot}, outside the cache's {slots} slots")]
    Slot {
        /// The sequence.
        seq: usize,
        /// The key's index in the sequence.
        key: usize,
        /// Its slot.
        slot: i64,
        /// Slots of the cache.
        slots: usize,
    },
}

/// The shapes of a call: `q` and `out` are `[tokens, heads, head_dim]`, each
/// cache `[slots, kv_heads, head_dim]`, `rows`, `key_starts` and `lens`
/// `[seqs]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionDims {
    /// Rows of `q` and `out` (the step's tokens).
    pub tokens: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (a divisor of `heads`).
    pub kv_heads: usize,
    /// Dimensions of a head.
    pub head_dim: usize,
    /// Slots of each cache.
    pub slots: usize,
    /// Sequences attended.
    pub seqs: usize,
    /// The longest sequence's key count (or more): what its scores hold.
    pub max_keys: usize,
}

/// What a call reads.
#[derive(Debug, Clone, Copy)]
pub struct DecodeInputs<'a> {
    /// The queries, `[tokens, heads, head_dim]`.
    pub q: &'a [f32],
    /// The keys, `[slots, kv_heads, head_dim]`.
    pub key_cache: KvCache<'a>,
    /// The values, `[slots, kv_heads, head_dim]`, of the keys' type.
    pub value_cache: KvCache<'a>,
    /// Each sequence's row of `q` and `out`, strictly increasing.
    pub rows: &'a [i64],
    /// The key slots of every sequence, in order: sequence `s` reads
    /// `key_slots[key_starts[s]..key_starts[s] + lens[s]]` (sequences may share them).
    pub key_slots: &'a [i64],
    /// Where each sequence's keys start in `key_slots`.
    pub key_starts: &'a [i64],
    /// Each sequence's key count.
    pub lens: &'a [i64],
    /// The factor of the scores (`1 / sqrt(head_dim)` for the usual scaling).
    pub scale: f32,
}

/// Checks every length, row, key count and slot a call would use.
pub fn check_attention(inputs: &DecodeInputs<'_>, out: usize, dims: AttentionDims) -> Result<(), AttentionError> {
    let AttentionDims { tokens, heads, kv_heads, head_dim, slots, seqs, max_keys } = dims;
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) || heads == 0 {
        return Err(AttentionError::Heads { heads, kv_heads });
    }
    if head_dim == 0 {
        return Err(AttentionError::HeadDim);
    }
    let cache = slots * kv_heads * head_dim;
    if !inputs.key_cache.same_type(&inputs.value_cache) {
        return Err(AttentionError::CacheTypes);
    }
    for (what, got, need) in [
        ("q", inputs.q.len(), tokens * heads * head_dim),
        ("out", out, tokens * heads * head_dim),
        ("key_cache", inputs.key_cache.len(), cache),
        ("value_cache", inputs.value_cache.len(), cache),
        ("rows", inputs.rows.len(), seqs),
        ("lens", inputs.lens.len(), seqs),
        ("key_starts", inputs.key_starts.len(), seqs),
    ] {
        if got != need {
            return Err(AttentionError::Len { what, got, need });
        }
    }
    let mut previous = -1i64;
    for seq in 0..seqs {
        let row = inputs.rows[seq];
        if row <= previous || row as u64 >= tokens as u64 {
            return Err(AttentionError::Row { seq, row, tokens });
        }
        previous = row;
        let len = inputs.lens[seq];
        if len < 1 || len as u64 > max_keys as u64 {
            return Err(AttentionError::Keys { seq, len, max_keys });
        }
        let (start, available) = (inputs.key_starts[seq], inputs.key_slots.len());
        if start < 0 || start as u64 + len as u64 > available as u64 {
            return Err(AttentionError::KeyRange { seq, start, len, available });
        }
        let keys = &inputs.key_slots[start as usize..(start + len) as usize];
        if let Some((key, &slot)) = keys.iter().enumerate().find(|(_, &s)| s < 0 || s as u64 >= slots as u64) {
            return Err(AttentionError::Slot { seq, key, slot, slots });
        }
    }
    Ok(())
}

/// Writes each sequence's attention output into its row of `out` (other
/// rows are left as they are), on `path` (which must be supported), the
/// sequences split across `threads` (at least 1).
pub fn decode_attention(
    path: Path,
    inputs: &DecodeInputs<'_>,
    out: &mut [f32],
    dims: AttentionDims,
    threads: usize,
) -> Result<(), AttentionError> {
    check_attention(inputs, out.len(), dims)?;
    // SAFETY: just checked.
    unsafe { attend(path, inputs, out, dims, threads) };
    Ok(())
}

/// `decode_attention` without its checks, for a caller that checked the
/// call once for many (the decoder checks a step's slots once, not per layer).
///
/// # Safety
/// `check_attention(inputs, out.len(), dims)` would pass.
pub(crate) unsafe fn attend(
    path: Path,
    inputs: &DecodeInputs<'_>,
    out: &mut [f32],
    dims: AttentionDims,
    threads: usize,
) {
    let job = Job { inputs, out: Out(out.as_mut_ptr()), dims };
    let run = |seqs: std::ops::Range<usize>| {
        // SAFETY: everything was checked above; the rows are strictly
        // increasing, so the threads' sequences write disjoint rows.
        unsafe {
            match path {
                Path::Scalar => sequences::<false>(&job, seqs),
                #[cfg(target_arch = "x86_64")]
                // Attention is a small share of a step: AVX-512 CPUs run the AVX2 code.
                Path::Avx2 | Path::Avx512 => {
                    assert!(crate::x86::supported(), "the AVX2 path needs AVX2, FMA and F16C");
                    if dims.head_dim.is_multiple_of(8) {
                        simd::sequences(&job, seqs)
                    } else {
                        // Heads of whole vectors only; the result is the same arithmetic.
                        sequences::<false>(&job, seqs)
                    }
                }
                #[cfg(not(target_arch = "x86_64"))]
                Path::Avx2 | Path::Avx512 => panic!("the SIMD paths need an x86-64 CPU"),
            }
        }
    };
    let parts = crate::parts_for(threads).min(dims.seqs).max(1);
    crate::pool::run(parts, threads, &|p| run(dims.seqs * p / parts..dims.seqs * (p + 1) / parts));
}

/// One checked call, as each thread's part of it sees it.
struct Job<'a> {
    inputs: &'a DecodeInputs<'a>,
    out: Out,
    dims: AttentionDims,
}

/// Sequences `seqs` of the call: with `SIMD`, dot products and value sums
/// in AVX2 vectors and the rows prefetched (only inlined into
/// `simd::sequences`, which enables the features); without, plain float32
/// loops in index order. Keys outermost: a key's row holds every key/value
/// head (`kv_heads * head_dim` floats, contiguous), and a block of the cache
/// is consecutive slots, so the cache is read in order, once; the scores of
/// every head are kept (`heads x len`), then the value rows are read in the
/// same order into the output row, which stays in L1.
///
/// # Safety
/// The call was checked (`check_attention`), no other thread writes these
/// sequences' rows, and with `SIMD` the CPU has AVX2, FMA and F16C and
/// `head_dim` is a multiple of 8.
#[inline(always)]
unsafe fn sequences<const SIMD: bool>(job: &Job<'_>, seqs: std::ops::Range<usize>) {
    let AttentionDims { heads, kv_heads, head_dim: hd, max_keys, .. } = job.dims;
    let inputs = job.inputs;
    let (group, kv_row) = (heads / kv_heads, kv_heads * hd);
    let mut scores = vec![0.0f32; heads * max_keys];
    // Where a 16-bit cache's rows are widened to float32.
    let mut key_bufs: [Vec<f32>; KEYS_AT_ONCE] = std::array::from_fn(|_| vec![0.0f32; kv_row]);
    let mut value_buf = vec![0.0f32; kv_row];
    for seq in seqs {
        let row = inputs.rows[seq] as usize;
        let len = inputs.lens[seq] as usize;
        let start = inputs.key_starts[seq] as usize;
        let slots = &inputs.key_slots[start..start + len];
        let scores = &mut scores[..heads * len];
        let q = &inputs.q[row * heads * hd..(row + 1) * heads * hd];
        let mut j = 0;
        while j < len {
            // With SIMD, KEYS_AT_ONCE keys at a time: their dot products
            // with a head are reduced together (`simd::dot4`).
            let keys_now = if SIMD && j + KEYS_AT_ONCE <= len { KEYS_AT_ONCE } else { 1 };
            let mut rows: [&[f32]; KEYS_AT_ONCE] = [&[]; KEYS_AT_ONCE];
            for (r, (row, buf)) in rows.iter_mut().zip(key_bufs.iter_mut()).take(keys_now).enumerate() {
                let slot = slots[j + r];
                if SIMD {
                    // This sequence's value rows are read after all its keys:
                    // asked for now, they arrive while the keys are scored.
                    prefetch(inputs.value_cache.row_bytes(slot, kv_row));
                    if let Some(&ahead) = slots.get(j + r + PREFETCH_KEYS) {
                        prefetch(inputs.key_cache.row_bytes(ahead, kv_row));
                    }
                }
                // SAFETY: the slot was checked; with SIMD the CPU has the features.
                *row = unsafe { inputs.key_cache.row::<SIMD>(slot, kv_row, buf) };
            }
            for (h, qh) in q.chunks_exact(hd).enumerate() {
                let head = h / group * hd..(h / group + 1) * hd;
                if keys_now == KEYS_AT_ONCE {
                    #[cfg(target_arch = "x86_64")]
                    {
                        let ks =
                            [&rows[0][head.clone()], &rows[1][head.clone()], &rows[2][head.clone()], &rows[3][head]];
                        // SAFETY: with SIMD the CPU has the features (the caller's promise).
                        let dots = unsafe { simd::dot4(qh, ks) };
                        for (r, d) in dots.into_iter().enumerate() {
                            scores[h * len + j + r] = d * inputs.scale;
                        }
                    }
                } else {
                    // SAFETY: with SIMD the CPU has the features (the caller's promise).
                    scores[h * len + j] = unsafe { dot::<SIMD>(qh, &rows[0][head]) } * inputs.scale;
                }
            }
            j += keys_now;
        }
        let mut sums = [0.0f32; MAX_STACK_HEADS];
        let mut heap_sums = Vec::new();
        let sums: &mut [f32] = if heads <= MAX_STACK_HEADS {
            &mut sums[..heads]
        } else {
            heap_sums.resize(heads, 0.0);
            &mut heap_sums
        };
        for (head, sum) in scores.chunks_exact_mut(len).zip(sums.iter_mut()) {
            let max = head.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            for score in head.iter_mut() {
                *score = (*score - max).exp();
                *sum += *score;
            }
        }
        // SAFETY: this row is this thread's (the caller's promise), and it
        // is inside out (checked: row < tokens).
        let acc = unsafe { std::slice::from_raw_parts_mut(job.out.0.add(row * heads * hd), heads * hd) };
        acc.fill(0.0);
        // SAFETY: the slots were checked; with SIMD the CPU has the features.
        if !(SIMD && unsafe { values_in_registers(job, scores, slots, acc) }) {
            for (j, &slot) in slots.iter().enumerate() {
                // SAFETY: as for the keys.
                let values = unsafe { inputs.value_cache.row::<SIMD>(slot, kv_row, &mut value_buf) };
                for (h, acc_h) in acc.chunks_exact_mut(hd).enumerate() {
                    let v = &values[h / group * hd..(h / group + 1) * hd];
                    // SAFETY: as above.
                    unsafe { axpy::<SIMD>(scores[h * len + j], v, acc_h) };
                }
            }
        }
        for (acc_h, sum) in acc.chunks_exact_mut(hd).zip(sums.iter()) {
            let inv = 1.0 / sum;
            acc_h.iter_mut().for_each(|a| *a *= inv);
        }
    }
}

/// Where the value cache is float32 and heads are at most 64 wide, each
/// head's weighted sum of its value rows into `acc` (zero on entry), kept
/// in registers while the rows are read (`simd::weighted_sum`: the same FMAs
/// in the same order as `axpy`'s, so the same bits); false, doing nothing,
/// elsewhere (16-bit values are widened a row at a time, once for every
/// head, by the caller's loop).
///
/// # Safety
/// The call was checked; the CPU has AVX2 and FMA; `scores` holds every
/// head's `slots.len()` weights and `acc` every head's output.
#[inline(always)]
unsafe fn values_in_registers(job: &Job<'_>, scores: &[f32], slots: &[i64], acc: &mut [f32]) -> bool {
    let AttentionDims { heads, kv_heads, head_dim: hd, .. } = job.dims;
    #[cfg(target_arch = "x86_64")]
    if let (true, KvCache::F32(cache)) = (hd <= 64, job.inputs.value_cache) {
        let (group, len) = (heads / kv_heads, slots.len());
        for (h, acc_h) in acc.chunks_exact_mut(hd).enumerate() {
            // SAFETY: the slots were checked; hd is a multiple of 8 up to 64.
            unsafe {
                simd::weighted_sum(&scores[h * len..(h + 1) * len], cache, slots, kv_heads * hd, h / group * hd, acc_h)
            };
        }
        return true;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (heads, kv_heads, hd, scores, slots, acc);
    false
}

/// Heads whose softmax sums live on the stack (more go to the heap).
const MAX_STACK_HEADS: usize = 128;

/// Keys the SIMD path scores at once: 4 dot products reduced together
/// take 4 horizontal additions where 4 reduced one by one take 24; a
/// 2,048-token prefill spent an eighth of its time scoring keys.
const KEYS_AT_ONCE: usize = 4;

/// How many keys ahead of the one it scores the SIMD path asks for a key row.
const PREFETCH_KEYS: usize = 4;

/// Asks for the `(address, bytes)` row to be brought into the caches
/// (SIMD path only; a no-op elsewhere).
#[inline(always)]
fn prefetch((row, bytes): (*const u8, usize)) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes).step_by(64) {
        // SAFETY: SSE is part of x86-64; a prefetch never faults.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(row.wrapping_add(line).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (row, bytes);
}

/// `a · b` (equal lengths; with SIMD a multiple of 8).
///
/// # Safety
/// With SIMD the CPU has AVX2 and FMA.
#[inline(always)]
unsafe fn dot<const SIMD: bool>(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if SIMD {
        // SAFETY: forwarded.
        return unsafe { simd::dot(a, b) };
    }
    a.iter().zip(b).fold(0.0f32, |acc, (x, y)| acc + x * y)
}

/// `acc += p * v` (equal lengths; with SIMD a multiple of 8).
///
/// # Safety
/// With SIMD the CPU has AVX2 and FMA.
#[inline(always)]
unsafe fn axpy<const SIMD: bool>(p: f32, v: &[f32], acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if SIMD {
        // SAFETY: forwarded.
        return unsafe { simd::axpy(p, v, acc) };
    }
    acc.iter_mut().zip(v).for_each(|(a, x)| *a += p * x);
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::Job;

    /// `super::sequences` compiled with AVX2, FMA and F16C enabled.
    ///
    /// # Safety
    /// As `super::sequences::<true>`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn sequences(job: &Job<'_>, seqs: std::ops::Range<usize>) {
        // SAFETY: forwarded.
        unsafe { super::sequences::<true>(job, seqs) }
    }

    /// `a · b` over vectors of 8 lanes (two accumulators), then the lanes summed.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
        debug_assert!(a.len() == b.len() && a.len().is_multiple_of(8));
        let (mut even, mut odd) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        // SAFETY (the loads): i + 8 <= len (or i + 16) for both slices.
        unsafe {
            while i + 16 <= a.len() {
                even = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), even);
                odd = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                    _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                    odd,
                );
                i += 16;
            }
            if i < a.len() {
                even = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), even);
            }
        }
        let v = _mm256_add_ps(even, odd);
        let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps::<1>(pair, pair)))
    }

    /// `q · k[r]` for the 4 rows of `k` (each of q's length, a multiple of
    /// 8): one accumulator of 8 lanes per row, the 4 reduced together by
    /// horizontal additions.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(super) fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
        debug_assert!(q.len().is_multiple_of(8) && k.iter().all(|r| r.len() == q.len()));
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in (0..q.len()).step_by(8) {
            // SAFETY (the loads): i + 8 <= len for q and every row.
            unsafe {
                let qv = _mm256_loadu_ps(q.as_ptr().add(i));
                for (a, row) in acc.iter_mut().zip(&k) {
                    *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(row.as_ptr().add(i)), *a);
                }
            }
        }
        // [r0 r0 r1 r1 | ...] pairs, then [r0 r1 r2 r3] per 128-bit half.
        let pairs = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
        let sums = _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps::<1>(pairs));
        let mut out = [0.0f32; 4];
        // SAFETY: 4 floats of room.
        unsafe { _mm_storeu_ps(out.as_mut_ptr(), sums) };
        out
    }

    /// `out = sum over j of probs[j] * row(slots[j])[offset..offset + out.len()]`
    /// (`out` zero on entry; its length a multiple of 8, at most 64), the
    /// sum in registers, each term added by one FMA in key order as `axpy`
    /// adds it.
    ///
    /// # Safety
    /// Every slot's row of `kv_row` floats lies in `cache`, and `offset +
    /// out.len() <= kv_row`; the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted_sum(
        probs: &[f32],
        cache: &[f32],
        slots: &[i64],
        kv_row: usize,
        offset: usize,
        out: &mut [f32],
    ) {
        let vecs = out.len() / 8;
        let mut acc = [_mm256_setzero_ps(); 8];
        for (&p, &slot) in probs.iter().zip(slots) {
            let pv = _mm256_set1_ps(p);
            // SAFETY: the caller's bounds.
            unsafe {
                let row = cache.as_ptr().add(slot as usize * kv_row + offset);
                for (v, a) in acc.iter_mut().enumerate().take(vecs) {
                    *a = _mm256_fmadd_ps(pv, _mm256_loadu_ps(row.add(8 * v)), *a);
                }
            }
        }
        for (v, a) in acc.iter().enumerate().take(vecs) {
            // SAFETY: 8 floats of out at 8 v < out.len().
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * v), *a) };
        }
    }

    /// `acc += p * v`, 8 lanes at a time.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(super) fn axpy(p: f32, v: &[f32], acc: &mut [f32]) {
        debug_assert!(v.len() == acc.len() && v.len().is_multiple_of(8));
        let pv = _mm256_set1_ps(p);
        for (a, x) in acc.chunks_exact_mut(8).zip(v.chunks_exact(8)) {
            // SAFETY: both chunks hold 8 floats.
            unsafe {
                let sum = _mm256_fmadd_ps(pv, _mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(a.as_ptr()));
                _mm256_storeu_ps(a.as_mut_ptr(), sum);
            }
        }
    }
}
