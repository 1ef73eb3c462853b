//! A whole decoder step of the Llama family (Llama, Mistral, Qwen2, Qwen3, Granite, SmolLM3, Phi-3 and
//! the models shaped like them) over the kernels of this crate, with no
//! interpreter between its operations: the engine hands over a step's
//! embedded tokens, positions and cache slots once, and gets the logits of
//! the rows it samples. A batch-1 step of a 30-layer model is about 400
//! small operations; run one by one from Python they cost more than the
//! weights take to read: in one call a batch-1 SmolLM2 step went from 17.9
//! to 9.4 ms (the engine driven directly; docs/real-model-speed.md, "The
//! native step").
//!
//! The arithmetic is the torch path's (`engine/models/llama.py`), operation for
//! operation, in float32: RMSNorm (`x * rsqrt(mean(x²) + eps) * w`), the
//! projections (with their biases), the per-head q/k RMSNorms, RoPE in
//! transformers' rotate-half layout (`x·cos + rotate_half(x)·sin`), the
//! keys and values written to their cache slots, attention over the paged
//! cache (causal, windowed for layers with a sliding window), SwiGLU
//! (`silu(gate) · up`), the residuals, the final norm and the output head.
//! Gemma 3's layers (`engine/models/gemma3.py`) are the same operations
//! plus a norm of the attention's and of the MLP's output before each joins
//! the residual stream, a tanh-GELU gate, and two RoPE tables (the windowed
//! layers' base and the global layers').
//! Only summation orders and the last bit of `exp`, `sin` and `cos` differ
//! from torch's, so logits agree within float32 rounding (the engine's
//! tests check it on every architecture and weight format).

use crate::attention::{attend, check_attention};
use crate::experts::{Expert, Experts};
use crate::kv_cache::{KvCache, KvCacheMut};
use crate::linear::{product, Activation, Linear};
use crate::rows::{for_row_ranges, rows_of};
use crate::step_error::StepError;
use crate::{matmuls, AttentionDims, DecodeInputs, Out, Path, Precision};

/// The sizes and constants every layer shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Width of the residual stream.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (a divisor of `heads`).
    pub kv_heads: usize,
    /// Dimensions of a head (even: RoPE rotates halves).
    pub head_dim: usize,
    /// Width of the MLP.
    pub intermediate: usize,
    /// Rows of the output head.
    pub vocab: usize,
    /// The RMSNorms' epsilon.
    pub eps: f32,
    /// The factor of the attention scores.
    pub scale: f32,
    /// The factor of each attention and MLP output before it joins the
    /// residual stream (Granite's `residual_multiplier`; 1 for the others).
    pub residual_scale: f32,
    /// The leading dimensions of each head that RoPE rotates (even, at most
    /// `head_dim`; Phi's partial rotary); the rest pass through.
    pub rotary_dim: usize,
    /// The factor of RoPE's cosines and sines (LongRoPE's attention factor; 1 for the others).
    pub rope_scale: f32,
    /// The MLP's gate activation.
    pub activation: Activation,
}

/// One decoder layer's weights.
#[derive(Debug, Clone)]
pub struct Layer<'a> {
    /// The norm before attention.
    pub input_norm: &'a [f32],
    /// Query projection.
    pub q: Linear<'a>,
    /// Key projection.
    pub k: Linear<'a>,
    /// Value projection.
    pub v: Linear<'a>,
    /// Output projection.
    pub o: Linear<'a>,
    /// RMSNorm of each query head (Qwen3), if the model has it.
    pub q_norm: Option<&'a [f32]>,
    /// RMSNorm of each key head (Qwen3), if the model has it.
    pub k_norm: Option<&'a [f32]>,
    /// The norm of the attention's output before it joins the residual
    /// stream (Gemma 3's `post_attention_layernorm`), if the model has it.
    pub attention_output_norm: Option<&'a [f32]>,
    /// The norm before the MLP (Llama's `post_attention_layernorm`, Gemma 3's
    /// `pre_feedforward_layernorm`).
    pub post_attention_norm: &'a [f32],
    /// The MLP: dense, or a mixture of experts.
    pub mlp: Mlp<'a>,
    /// The norm of the MLP's output before it joins the residual stream
    /// (Gemma 3's `post_feedforward_layernorm`), if the model has it.
    pub mlp_output_norm: Option<&'a [f32]>,
    /// A query sees only keys less than this many positions before it.
    pub window: Option<usize>,
    /// Which of the decoder's `inv_freqs` rotates q and k by position; None
    /// for a layer without RoPE (SmolLM3 leaves some out).
    pub rope: Option<usize>,
    /// The KV-cache group whose slots the layer's keys and values use: 0
    /// (`StepInputs::slot_mapping`, `key_slots`) or g (`StepInputs::groups[g - 1]`;
    /// Gemma 3's windowed layers keep a block table of their own).
    pub kv_group: usize,
}

/// A layer's MLP.
#[derive(Debug, Clone)]
pub enum Mlp<'a> {
    /// One gated MLP of `Shape::intermediate` that every token runs.
    Dense(Expert<'a>),
    /// Routed experts (`experts.rs`).
    Experts(Experts<'a>),
}

/// A further KV-cache group's slots in a step, laid out as the first
/// group's (`StepInputs::slot_mapping`, `key_slots`; the same `key_starts`).
#[derive(Debug, Clone, Copy)]
pub struct GroupSlots<'a> {
    /// Each token's cache slot.
    pub slot_mapping: &'a [i64],
    /// The key slots of the step's sequences, each from position 0.
    pub key_slots: &'a [i64],
}

/// The model: its layers, the final norm, the output head and RoPE's
/// inverse frequencies (`rotary_dim / 2` of them per table, scaling applied).
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    /// Sizes and constants.
    pub shape: Shape,
    /// The layers, in order.
    pub layers: Vec<Layer<'a>>,
    /// The final norm.
    pub norm: &'a [f32],
    /// The output head (the embeddings' blocks when they are tied).
    pub head: Linear<'a>,
    /// RoPE's inverse frequencies, one table per base the layers use
    /// (Gemma 3's global and windowed layers differ; one for the others).
    pub inv_freqs: Vec<&'a [f32]>,
    /// LongRoPE's long factors' table (Phi-3): the tokens `StepInputs::long_rope`
    /// flags rotate by it instead of `inv_freqs[0]`.
    pub long_inv_freq: Option<&'a [f32]>,
    /// How the projections and the output head multiply (`Exact`, or int8
    /// activations for the weight types that path reads, in the products
    /// whose row counts `int8_runs` names; the others multiply exactly).
    pub precision: Precision,
}

/// One layer's KV cache, each half `[slots, kv_heads, head_dim]`, both of one type.
#[derive(Debug)]
pub struct LayerCache<'a> {
    /// The keys.
    pub keys: KvCacheMut<'a>,
    /// The values.
    pub values: KvCacheMut<'a>,
}

/// What a step computes: for each token (row of the embedded input), its
/// position, the cache slot its key and value go to, and where its
/// sequence's keys start in `key_slots` (the slot of its position-`p` key is
/// `key_slots[key_starts[t] + p]`); and the rows whose logits are wanted.
#[derive(Debug, Clone, Copy)]
pub struct StepInputs<'a> {
    /// Each token's position in its sequence.
    pub positions: &'a [i64],
    /// Each token's cache slot.
    pub slot_mapping: &'a [i64],
    /// Each token's sequence's first key in `key_slots`.
    pub key_starts: &'a [i64],
    /// The key slots of the step's sequences, each from position 0.
    pub key_slots: &'a [i64],
    /// The rows whose logits are returned, in this order.
    pub logits_rows: &'a [i64],
    /// Per token, nonzero where it rotates by the decoder's `long_inv_freq`
    /// (its sequence is past LongRoPE's original context); None: none does.
    pub long_rope: Option<&'a [u8]>,
    /// The slots of KV-cache groups 1, 2, ... (empty for a model of one group).
    pub groups: &'a [GroupSlots<'a>],
}

impl<'a> StepInputs<'a> {
    /// KV-cache group `g`'s slots: its tokens' slots and its sequences' key slots.
    fn group(&self, g: usize) -> GroupSlots<'a> {
        match g {
            0 => GroupSlots { slot_mapping: self.slot_mapping, key_slots: self.key_slots },
            g => self.groups[g - 1],
        }
    }
}

/// Steps with at least this many tokens run their norms and activations on
/// the pool's threads too (below, waking the threads costs more than it saves).
const PARALLEL_MIN_TOKENS: usize = 32;

impl Decoder<'_> {
    /// Checks that every weight has the model's shape and the heads fit.
    pub fn check(&self) -> Result<(), StepError> {
        let Shape { hidden, heads, kv_heads, head_dim, intermediate, vocab, rotary_dim, .. } = self.shape;
        if heads == 0
            || kv_heads == 0
            || !heads.is_multiple_of(kv_heads)
            || head_dim == 0
            || rotary_dim > head_dim
            || !rotary_dim.is_multiple_of(2)
        {
            return Err(StepError::Shape(format!(
                "heads = {heads}, kv_heads = {kv_heads}, head_dim = {head_dim}, rotary_dim = {rotary_dim}: heads must \
                 be a positive multiple of kv_heads, head_dim positive and rotary_dim even and at most head_dim"
            )));
        }
        let vector = |what: String, got: usize, need: usize| {
            if got == need {
                Ok(())
            } else {
                Err(StepError::Len { what, got, need })
            }
        };
        let linear = |what: String, l: &Linear<'_>, need_out: usize, need_in: usize| {
            if (l.out_features, l.in_features) != (need_out, need_in) {
                return Err(StepError::Weight {
                    what,
                    got_out: l.out_features,
                    got_in: l.in_features,
                    need_out,
                    need_in,
                });
            }
            vector(format!("{what} (bytes)"), l.rows.len(), need_out * l.quant.row_bytes(need_in))?;
            l.bias.map_or(Ok(()), |b| vector(format!("{what} bias"), b.len(), need_out))
        };
        for (i, table) in self.inv_freqs.iter().enumerate() {
            vector(format!("inv_freqs[{i}]"), table.len(), rotary_dim / 2)?;
        }
        if let Some(table) = self.long_inv_freq {
            vector("long_inv_freq".into(), table.len(), rotary_dim / 2)?;
        }
        vector("norm".into(), self.norm.len(), hidden)?;
        linear("head".into(), &self.head, vocab, hidden)?;
        let (q_out, kv_out) = (heads * head_dim, kv_heads * head_dim);
        for (i, l) in self.layers.iter().enumerate() {
            if let Some(table) = l.rope.filter(|&t| t >= self.inv_freqs.len()) {
                return Err(StepError::Shape(format!(
                    "layer {i}: RoPE table {table}, but the model has {}",
                    self.inv_freqs.len()
                )));
            }
            let name = |what: &str| format!("layer {i} {what}");
            vector(name("input_norm"), l.input_norm.len(), hidden)?;
            vector(name("post_attention_norm"), l.post_attention_norm.len(), hidden)?;
            linear(name("q"), &l.q, q_out, hidden)?;
            linear(name("k"), &l.k, kv_out, hidden)?;
            linear(name("v"), &l.v, kv_out, hidden)?;
            linear(name("o"), &l.o, hidden, q_out)?;
            match &l.mlp {
                Mlp::Dense(d) => {
                    linear(name("gate"), &d.gate, intermediate, hidden)?;
                    linear(name("up"), &d.up, intermediate, hidden)?;
                    linear(name("down"), &d.down, hidden, intermediate)?;
                }
                Mlp::Experts(e) => e.check(hidden, &name)?,
            }
            // Per head (Qwen3), or over all heads at once (OLMoE).
            for (what, norm, whole) in [("q_norm", l.q_norm, q_out), ("k_norm", l.k_norm, kv_out)] {
                if let Some(n) = norm.filter(|n| n.len() != whole) {
                    vector(name(what), n.len(), head_dim)?;
                }
            }
            for (what, norm) in
                [("attention_output_norm", l.attention_output_norm), ("mlp_output_norm", l.mlp_output_norm)]
            {
                norm.map_or(Ok(()), |n| vector(name(what), n.len(), hidden))?;
            }
            if l.window == Some(0) {
                return Err(StepError::Shape(format!("layer {i}: a sliding window of 0 keys")));
            }
        }
        Ok(())
    }

    /// Runs the layers over the step's tokens `x` (`[tokens, hidden]`, the
    /// embedded inputs; left holding the last layer's residual stream),
    /// writing each layer's keys and values into `caches`, then writes the
    /// logits of `inputs.logits_rows` into `logits` (`[rows, vocab]`). On
    /// `path` (which must be supported), the work split across `threads`.
    /// Everything is checked before anything is written.
    pub fn forward(
        &self,
        path: Path,
        x: &mut [f32],
        caches: &mut [LayerCache<'_>],
        inputs: &StepInputs<'_>,
        logits: &mut [f32],
        threads: usize,
    ) -> Result<(), StepError> {
        let s = self.shape;
        let tokens = inputs.positions.len();
        let group_slots = self.check_step(x, caches, inputs, logits)?;
        if tokens == 0 {
            return Ok(());
        }
        let half = s.rotary_dim / 2;
        // Each table's cos and sin, made when a layer first uses it.
        let mut ropes: Vec<Option<(Vec<f32>, Vec<f32>)>> = vec![None; self.inv_freqs.len()];
        let mut windows: Vec<(Option<usize>, Keys)> = Vec::new();
        let (q_out, kv_out) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let mut h = vec![0.0f32; tokens * s.hidden];
        let (mut q, mut k, mut v) =
            (vec![0.0f32; tokens * q_out], vec![0.0f32; tokens * kv_out], vec![0.0f32; tokens * kv_out]);
        let mut attended = vec![0.0f32; tokens * q_out];
        let mut residual = vec![0.0f32; tokens * s.hidden];
        let (mut gate, mut up) = (vec![0.0f32; tokens * s.intermediate], vec![0.0f32; tokens * s.intermediate]);
        let parallel = if tokens >= PARALLEL_MIN_TOKENS { threads } else { 1 };
        let precision = self.precision;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            rms_norm_rows(x, &mut h, layer.input_norm, s.eps, parallel);
            let m = tokens;
            matmuls(
                path,
                precision,
                &mut [
                    product(&layer.q, &h, &mut q, m),
                    product(&layer.k, &h, &mut k, m),
                    product(&layer.v, &h, &mut v, m),
                ],
                threads,
            )?;
            for (l, out) in [(&layer.q, &mut q), (&layer.k, &mut k), (&layer.v, &mut v)] {
                add_bias(l, out);
            }
            if let Some(w) = layer.q_norm {
                rms_norm_in_place(&mut q, w, s.eps);
            }
            if let Some(w) = layer.k_norm {
                rms_norm_in_place(&mut k, w, s.eps);
            }
            if let Some(table) = layer.rope.filter(|_| half > 0) {
                let (cos, sin) = ropes[table].get_or_insert_with(|| {
                    // LongRoPE's long factors stand in for the first table only.
                    let long = self.long_inv_freq.zip(inputs.long_rope).filter(|_| table == 0);
                    rope_tables(inputs.positions, self.inv_freqs[table], long, s.rope_scale)
                });
                rope(&mut q, cos, sin, half, s.head_dim);
                rope(&mut k, cos, sin, half, s.head_dim);
            }
            let group = inputs.group(layer.kv_group);
            for (t, &slot) in group.slot_mapping.iter().enumerate() {
                cache.keys.write_row(slot, &k[t * kv_out..(t + 1) * kv_out]);
                cache.values.write_row(slot, &v[t * kv_out..(t + 1) * kv_out]);
            }
            if !windows.iter().any(|(w, _)| *w == layer.window) {
                windows.push((layer.window, Keys::new(inputs, layer.window)));
            }
            let keys = &windows.iter().find(|(w, _)| *w == layer.window).expect("just added").1;
            let attention = DecodeInputs {
                q: &q,
                key_cache: cache.keys.as_ref(),
                value_cache: cache.values.as_ref(),
                rows: &keys.rows,
                key_slots: group.key_slots,
                key_starts: &keys.starts,
                lens: &keys.lens,
                scale: s.scale,
            };
            let dims = AttentionDims {
                tokens,
                heads: s.heads,
                kv_heads: s.kv_heads,
                head_dim: s.head_dim,
                slots: group_slots[layer.kv_group],
                seqs: tokens,
                max_keys: keys.longest,
            };
            // SAFETY: `check_step` checked every slot, start and length
            // these inputs hold (`Keys` only narrows a token's keys).
            unsafe { attend(path, &attention, &mut attended, dims, threads) };
            matmuls(path, precision, &mut [product(&layer.o, &attended, &mut residual, m)], threads)?;
            add_bias(&layer.o, &mut residual);
            add_output(x, &residual, &mut h, layer.attention_output_norm, s, parallel);
            rms_norm_rows(x, &mut h, layer.post_attention_norm, s.eps, parallel);
            match &layer.mlp {
                Mlp::Dense(d) => d.forward_into(
                    path,
                    precision,
                    s.activation,
                    &h,
                    [&mut gate, &mut up],
                    &mut residual,
                    threads,
                    parallel,
                )?,
                Mlp::Experts(e) => e.forward(path, precision, s.activation, &h, &mut residual, threads)?,
            }
            add_output(x, &residual, &mut h, layer.mlp_output_norm, s, parallel);
        }
        let rows = inputs.logits_rows.len();
        let mut last = vec![0.0f32; rows * s.hidden];
        for (i, &row) in inputs.logits_rows.iter().enumerate() {
            let row = row as usize;
            rms_norm(
                &x[row * s.hidden..(row + 1) * s.hidden],
                &mut last[i * s.hidden..(i + 1) * s.hidden],
                self.norm,
                s.eps,
            );
        }
        matmuls(path, precision, &mut [product(&self.head, &last, logits, rows)], threads)?;
        add_bias(&self.head, logits);
        Ok(())
    }

    /// Checks a step's buffers and every index it holds; returns each
    /// KV-cache group's slots (its layers' caches all hold as many).
    fn check_step(
        &self,
        x: &[f32],
        caches: &[LayerCache<'_>],
        inputs: &StepInputs<'_>,
        logits: &[f32],
    ) -> Result<Vec<usize>, StepError> {
        let s = self.shape;
        let tokens = inputs.positions.len();
        let len = |what: &str, got: usize, need: usize| {
            if got == need {
                Ok(())
            } else {
                Err(StepError::Len { what: what.into(), got, need })
            }
        };
        len("x", x.len(), tokens * s.hidden)?;
        len("key_starts", inputs.key_starts.len(), tokens)?;
        len("logits", logits.len(), inputs.logits_rows.len() * s.vocab)?;
        if let Some(flags) = inputs.long_rope {
            len("long_rope", flags.len(), tokens)?;
            if self.long_inv_freq.is_none() {
                return Err(StepError::Shape("long_rope flags a step of a model without a long RoPE table".into()));
            }
        }
        len("caches", caches.len(), self.layers.len())?;
        let kv_row = s.kv_heads * s.head_dim;
        let groups = 1 + inputs.groups.len();
        // Each group's cache length: its first layer's, which its others must share.
        let mut cache_lens: Vec<Option<usize>> = vec![None; groups];
        for (i, (layer, cache)) in self.layers.iter().zip(caches).enumerate() {
            if layer.kv_group >= groups {
                return Err(StepError::Shape(format!(
                    "layer {i} uses KV-cache group {}, but the step stages {groups}",
                    layer.kv_group
                )));
            }
            let (keys, values) = (cache.keys.as_ref(), cache.values.as_ref());
            let need = *cache_lens[layer.kv_group].get_or_insert(keys.len());
            if !need.is_multiple_of(kv_row) {
                return Err(StepError::Shape(format!(
                    "a layer's cache has {need} floats, not whole slots of {kv_row}"
                )));
            }
            len(&format!("layer {i} keys"), keys.len(), need)?;
            len(&format!("layer {i} values"), values.len(), need)?;
            if !keys.same_type(&values) || !keys.same_type(&caches[0].keys.as_ref()) {
                return Err(StepError::Shape(format!("layer {i}'s keys and values are not of the first layer's type")));
            }
        }
        let group_slots: Vec<usize> = cache_lens.iter().map(|l| l.unwrap_or(0) / kv_row).collect();
        for (g, &slots) in group_slots.iter().enumerate() {
            let group = inputs.group(g);
            let name = |what: &str| if g == 0 { what.to_string() } else { format!("group {g} {what}") };
            len(&name("slot_mapping"), group.slot_mapping.len(), tokens)?;
            len(&name("key_slots"), group.key_slots.len(), inputs.key_slots.len())?;
            let in_cache = |slot: i64| slot >= 0 && (slot as u64) < slots as u64;
            if let Some((key, &slot)) = group.key_slots.iter().enumerate().find(|(_, &slot)| !in_cache(slot)) {
                return Err(StepError::Shape(format!(
                    "{}[{key}] = {slot} is outside the cache's {slots} slots",
                    name("key_slots")
                )));
            }
            if let Some((token, &slot)) = group.slot_mapping.iter().enumerate().find(|(_, &slot)| !in_cache(slot)) {
                return Err(StepError::Token {
                    token,
                    what: format!(
                        "{} {slot} is outside the cache's {slots} slots",
                        if g == 0 { "slot".into() } else { name("slot") }
                    ),
                });
            }
        }
        for token in 0..tokens {
            let (position, start) = (inputs.positions[token], inputs.key_starts[token]);
            let what = if position < 0 {
                format!("position {position} is negative")
            } else if start < 0 || start as u64 + position as u64 >= inputs.key_slots.len() as u64 {
                format!("keys {start}..={start}+{position} are outside key_slots' {} slots", inputs.key_slots.len())
            } else {
                continue;
            };
            return Err(StepError::Token { token, what });
        }
        if let Some((index, &row)) =
            inputs.logits_rows.iter().enumerate().find(|(_, &r)| r < 0 || r as u64 >= tokens as u64)
        {
            return Err(StepError::LogitsRow { index, row, tokens });
        }
        if tokens > 0 {
            // The attention kernel's own checks of the heads (the slots were checked above).
            let empty = DecodeInputs {
                q: &[],
                key_cache: KvCache::F32(&[]),
                value_cache: KvCache::F32(&[]),
                rows: &[],
                key_slots: &[],
                key_starts: &[],
                lens: &[],
                scale: s.scale,
            };
            let dims = AttentionDims {
                tokens: 0,
                heads: s.heads,
                kv_heads: s.kv_heads,
                head_dim: s.head_dim,
                slots: 0,
                seqs: 0,
                max_keys: 0,
            };
            check_attention(&empty, 0, dims)?;
        }
        Ok(group_slots)
    }
}

/// The keys each token attends to through one window (or none): its row,
/// where its first key is in `key_slots` and how many it sees.
struct Keys {
    rows: Vec<i64>,
    starts: Vec<i64>,
    lens: Vec<i64>,
    longest: usize,
}

impl Keys {
    fn new(inputs: &StepInputs<'_>, window: Option<usize>) -> Keys {
        let tokens = inputs.positions.len();
        let (mut starts, mut lens) = (Vec::with_capacity(tokens), Vec::with_capacity(tokens));
        for (&position, &start) in inputs.positions.iter().zip(inputs.key_starts) {
            // A query at p sees keys p - window + 1 ..= p (transformers' sliding mask).
            let first = window.map_or(0, |w| (position + 1 - w as i64).max(0));
            starts.push(start + first);
            lens.push(position + 1 - first);
        }
        let longest = lens.iter().copied().max().unwrap_or(0) as usize;
        Keys { rows: (0..tokens as i64).collect(), starts, lens, longest }
    }
}

/// `out`'s rows plus the layer's bias, if it has one.
fn add_bias(l: &Linear<'_>, out: &mut [f32]) {
    if let Some(bias) = l.bias {
        for row in out.chunks_exact_mut(bias.len()) {
            row.iter_mut().zip(bias).for_each(|(o, b)| *o += b);
        }
    }
}

/// Adds a block's output `y` to the residual stream `x`: normed first
/// (into `scratch`, as wide as `y`) when the block has an output norm.
fn add_output(x: &mut [f32], y: &[f32], scratch: &mut [f32], norm: Option<&[f32]>, s: Shape, threads: usize) {
    match norm {
        Some(w) => {
            rms_norm_rows(y, scratch, w, s.eps, threads);
            add_rows(x, scratch, s.residual_scale);
        }
        None => add_rows(x, y, s.residual_scale),
    }
}

/// `x += y * scale`, element by element (no multiply for 1: the same values).
fn add_rows(x: &mut [f32], y: &[f32], scale: f32) {
    if scale == 1.0 {
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
    } else {
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b * scale);
    }
}

/// `out = x * rsqrt(mean(x²) + eps) * w` for one row (torch's `rms_norm`
/// in float32: the same operations, the sum in 8 lanes).
fn rms_norm(x: &[f32], out: &mut [f32], w: &[f32], eps: f32) {
    let scale = 1.0 / (sum_squares(x) / x.len() as f32 + eps).sqrt();
    for ((o, &a), &g) in out.iter_mut().zip(x).zip(w) {
        *o = a * scale * g;
    }
}

/// `rms_norm` of each row of `x` (rows of `w.len()`) into `out`, the rows
/// split across `threads`.
fn rms_norm_rows(x: &[f32], out: &mut [f32], w: &[f32], eps: f32, threads: usize) {
    let width = w.len();
    let out_ptr = Out(out.as_mut_ptr());
    for_row_ranges(x.len() / width, threads, &|rows| {
        // SAFETY: each range's rows are its own; `out` is as long as `x`.
        let out = unsafe { rows_of(out_ptr, &rows, width) };
        for (i, row) in rows.clone().enumerate() {
            rms_norm(&x[row * width..(row + 1) * width], &mut out[i * width..(i + 1) * width], w, eps);
        }
    });
}

/// `rms_norm` of each `w.len()`-wide piece of `x` (each head, or all heads at once), in place.
fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    for head in x.chunks_exact_mut(w.len()) {
        let scale = 1.0 / (sum_squares(head) / head.len() as f32 + eps).sqrt();
        head.iter_mut().zip(w).for_each(|(a, &g)| *a = *a * scale * g);
    }
}

/// `Σ x²` in 8 float32 lanes (vectorised by the compiler), then the lanes.
fn sum_squares(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().map(|a| a * a).sum();
    for chunk in chunks {
        for (lane, a) in lanes.iter_mut().zip(chunk) {
            *lane += a * a;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// RoPE's `cos` and `sin` of each position and frequency, `[tokens, half]`:
/// `(position as f32) * inv_freq` as torch forms the angles (`long`'s table
/// for the tokens its flags mark), times `scale` (LongRoPE's attention
/// factor) where it is not 1.
fn rope_tables(positions: &[i64], inv_freq: &[f32], long: Option<(&[f32], &[u8])>, scale: f32) -> (Vec<f32>, Vec<f32>) {
    let table = |t: usize| match long {
        Some((long_freq, flags)) if flags[t] != 0 => long_freq,
        _ => inv_freq,
    };
    let angles = positions.iter().enumerate().flat_map(|(t, &p)| table(t).iter().map(move |&f| p as f32 * f));
    if scale == 1.0 {
        angles.map(|a| (a.cos(), a.sin())).unzip()
    } else {
        angles.map(|a| (a.cos() * scale, a.sin() * scale)).unzip()
    }
}

/// Rotates the first `2 * half` dimensions of every head (of `head_dim`) of
/// each token's row by its position: `x·cos + rotate_half(x)·sin`,
/// rotate_half negating the second half moved first, as transformers
/// computes it; the rest of each head passes through.
fn rope(x: &mut [f32], cos: &[f32], sin: &[f32], half: usize, head_dim: usize) {
    let tokens = cos.len() / half;
    let row = x.len() / tokens;
    for (t, token) in x.chunks_exact_mut(row).enumerate() {
        let (c, s) = (&cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half]);
        for head in token.chunks_exact_mut(head_dim) {
            let (first, second) = head[..2 * half].split_at_mut(half);
            for i in 0..half {
                let (a, b) = (first[i], second[i]);
                first[i] = a * c[i] + -b * s[i];
                second[i] = b * c[i] + a * s[i];
            }
        }
    }
}
