//! The decoder step against a float64 reference written out here from the
//! model's definition (RMSNorm, RoPE in rotate-half layout, grouped-query
//! causal attention, a sliding window, q/k norms, biases, SwiGLU, the
//! head; Gemma 3's output norms, GeGLU and second RoPE table), on a tiny
//! random model with F16 weights: a prefill, then decodes,
//! two sequences in one step, on every path and 1 to 3 threads; a Q8_0
//! model at int8 activations within their looser bound; and the
//! checks that refuse a bad step before the cache is written.

mod common;

use common::{paths, Rng};
use vllm_rs_kernels::{
    dequantize_row, int8_runs, Activation, Decoder, Expert, Experts, GroupSlots, KvCacheMut, Layer, LayerCache, Linear,
    Mlp, Packed, Path, Precision, QuantType, Shape, StepError, StepInputs, INT8_FEW_ROWS,
};

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const INTER: usize = 96;
const VOCAB: usize = 40;
const SLOTS: usize = 64;
const EPS: f32 = 1e-5;
/// Granite-style scaled residuals.
const RESIDUAL_SCALE: f32 = 0.75;
/// Phi-style partial rotary: RoPE on the first half of each head.
const ROTARY: usize = HEAD_DIM / 2;
/// LongRoPE-style scaled cosines and sines.
const ROPE_SCALE: f32 = 1.1;

/// Random F16 rows of weights in [-0.5, 0.5) (normal numbers, so exact).
fn f16_rows(rng: &mut Rng, n: usize, k: usize) -> Vec<u8> {
    (0..n * k)
        .flat_map(|_| {
            let sign = (rng.below(2) as u16) << 15;
            let exponent = (9 + rng.below(5)) as u16; // 2^-6 .. 2^-2
            (sign | exponent << 10 | rng.below(1024) as u16).to_le_bytes()
        })
        .collect()
}

/// Random Q8_0 rows: each block's scale 2^-9, its quants random, so weights
/// in [-0.25, 0.25).
fn q8_0_rows(rng: &mut Rng, n: usize, k: usize) -> Vec<u8> {
    (0..n * k / 32)
        .flat_map(|_| [0x00, 0x18].into_iter().chain((0..32).map(|_| rng.next() as u8)).collect::<Vec<u8>>())
        .collect()
}

/// RoPE's inverse frequencies of `base` over ROTARY dimensions.
fn inv_freq(base: f32) -> Vec<f32> {
    (0..ROTARY / 2).map(|i| 1.0 / base.powf(2.0 * i as f32 / ROTARY as f32)).collect()
}

fn floats(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.float() * scale).collect()
}

/// A linear layer's weights (row-major `[n, k]`) and bias, owned.
struct Weights {
    quant: QuantType,
    rows: Vec<u8>,
    dense: Vec<f64>,
    n: usize,
    k: usize,
    bias: Option<Vec<f32>>,
    /// The rows repacked for the int8 path (`Model::pack`).
    packed: Option<Packed>,
}

impl Weights {
    /// F16 or Q8_0 weights.
    fn new(rng: &mut Rng, quant: QuantType, n: usize, k: usize, bias: bool) -> Weights {
        let rows = if quant == QuantType::Q8_0 { q8_0_rows(rng, n, k) } else { f16_rows(rng, n, k) };
        let mut dense = vec![0.0f32; n * k];
        dequantize_row(quant, &rows, &mut dense);
        let bias = bias.then(|| floats(rng, n, 0.1));
        Weights { quant, rows, dense: dense.iter().map(|&w| w as f64).collect(), n, k, bias, packed: None }
    }

    fn linear(&self) -> Linear<'_> {
        Linear {
            quant: self.quant,
            rows: &self.rows,
            out_features: self.n,
            in_features: self.k,
            bias: self.bias.as_deref(),
            packed: self.packed.as_ref(),
        }
    }

    fn apply(&self, x: &[f64]) -> Vec<f64> {
        (0..self.n)
            .map(|j| {
                let dot: f64 = (0..self.k).map(|i| x[i] * self.dense[j * self.k + i]).sum();
                dot + self.bias.as_ref().map_or(0.0, |b| b[j] as f64)
            })
            .collect()
    }
}

struct LayerWeights {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    q: Weights,
    k: Weights,
    v: Weights,
    o: Weights,
    gate: Weights,
    up: Weights,
    down: Weights,
    attention_output_norm: Option<Vec<f32>>,
    mlp_output_norm: Option<Vec<f32>>,
    moe: Option<MoeWeights>,
    window: Option<usize>,
    rope: Option<usize>,
    kv_group: usize,
}

/// Routed experts: the router, each expert's (gate, up, down), top k,
/// renormalized or not, a shared expert and its gate.
struct MoeWeights {
    router: Vec<f32>,
    experts: Vec<[Weights; 3]>,
    top_k: usize,
    norm: bool,
    shared: Option<([Weights; 3], Vec<f32>)>,
}

fn expert_weights(rng: &mut Rng, inter: usize) -> [Weights; 3] {
    [
        Weights::new(rng, QuantType::F16, inter, HIDDEN, false),
        Weights::new(rng, QuantType::F16, inter, HIDDEN, false),
        Weights::new(rng, QuantType::F16, HIDDEN, inter, false),
    ]
}

fn expert(w: &[Weights; 3]) -> Expert<'_> {
    Expert { gate: w[0].linear(), up: w[1].linear(), down: w[2].linear() }
}

/// Two layers: the first with q/k/v biases and a window of 3 keys, the
/// second with q/k norms and no RoPE (as SmolLM3's NoPE layers); untied
/// head; residuals scaled by RESIDUAL_SCALE; RoPE on ROTARY dimensions of
/// each head, its cosines and sines scaled by ROPE_SCALE. Its linear layers
/// are of one type, F16 or Q8_0, multiplied at `precision`. Its Gemma 3
/// flavour (`Model::gemma`) norms both blocks' outputs, gates with GeGLU and
/// rotates both layers, the windowed one by a table of its own base.
struct Model {
    layers: Vec<LayerWeights>,
    norm: Vec<f32>,
    head: Weights,
    inv_freqs: Vec<Vec<f32>>,
    /// LongRoPE's long table and the positions from which a sequence's tokens use it.
    long_inv_freq: Option<Vec<f32>>,
    long_from: usize,
    activation: Activation,
    precision: Precision,
}

impl Model {
    fn new(seed: u64) -> Model {
        Model::of(seed, QuantType::F16)
    }

    /// The second layer's MLP 4 routed experts of 32, top 2: renormalized,
    /// or (`shared`) not, beside a shared expert of 64 (Qwen2-MoE).
    fn moe(seed: u64, shared: bool) -> Model {
        let mut model = Model::new(seed);
        let mut rng = Rng(seed + 200);
        model.layers[1].moe = Some(MoeWeights {
            router: floats(&mut rng, 4 * HIDDEN, 0.5),
            experts: (0..4).map(|_| expert_weights(&mut rng, 32)).collect(),
            top_k: 2,
            norm: !shared,
            shared: shared.then(|| (expert_weights(&mut rng, 64), floats(&mut rng, HIDDEN, 0.5))),
        });
        model
    }

    fn gemma(seed: u64) -> Model {
        let mut model = Model::of(seed, QuantType::F16);
        let mut rng = Rng(seed + 100);
        let norm = |rng: &mut Rng| Some((0..HIDDEN).map(|_| 1.0 + 0.2 * rng.float()).collect::<Vec<f32>>());
        for l in &mut model.layers {
            l.attention_output_norm = norm(&mut rng);
            l.mlp_output_norm = norm(&mut rng);
        }
        model.layers[0].rope = Some(1);
        model.layers[1].rope = Some(0);
        model.inv_freqs.push(inv_freq(100.0));
        model.activation = Activation::GeluTanh;
        model
    }

    fn of(seed: u64, quant: QuantType) -> Model {
        let mut rng = Rng(seed);
        let norm = |rng: &mut Rng, n| (0..n).map(|_| 1.0 + 0.2 * rng.float()).collect::<Vec<f32>>();
        let layers = (0..2)
            .map(|i| LayerWeights {
                input_norm: norm(&mut rng, HIDDEN),
                post_norm: norm(&mut rng, HIDDEN),
                q_norm: (i == 1).then(|| norm(&mut rng, HEAD_DIM)),
                k_norm: (i == 1).then(|| norm(&mut rng, HEAD_DIM)),
                q: Weights::new(&mut rng, quant, HEADS * HEAD_DIM, HIDDEN, i == 0),
                k: Weights::new(&mut rng, quant, KV_HEADS * HEAD_DIM, HIDDEN, i == 0),
                v: Weights::new(&mut rng, quant, KV_HEADS * HEAD_DIM, HIDDEN, i == 0),
                o: Weights::new(&mut rng, quant, HIDDEN, HEADS * HEAD_DIM, false),
                gate: Weights::new(&mut rng, quant, INTER, HIDDEN, false),
                up: Weights::new(&mut rng, quant, INTER, HIDDEN, false),
                down: Weights::new(&mut rng, quant, HIDDEN, INTER, false),
                attention_output_norm: None,
                mlp_output_norm: None,
                moe: None,
                window: (i == 0).then_some(3),
                rope: (i == 0).then_some(0),
                kv_group: 0,
            })
            .collect();
        let head = Weights::new(&mut rng, quant, VOCAB, HIDDEN, false);
        Model {
            layers,
            norm: norm(&mut rng, HIDDEN),
            head,
            inv_freqs: vec![inv_freq(10000.0)],
            long_inv_freq: None,
            long_from: usize::MAX,
            activation: Activation::Silu,
            precision: Precision::Exact,
        }
    }

    /// Every dense layer and the head repacked for the int8 path, as
    /// `DecoderStack` holds them at int8; false where this CPU repacks none.
    fn pack(&mut self) -> bool {
        let mut any = false;
        let all = self
            .layers
            .iter_mut()
            .flat_map(|l| [&mut l.q, &mut l.k, &mut l.v, &mut l.o, &mut l.gate, &mut l.up, &mut l.down]);
        for w in all.chain([&mut self.head]) {
            #[cfg(target_arch = "x86_64")]
            {
                w.packed = Packed::new(w.quant, &w.rows, w.n, w.k);
            }
            any |= w.packed.is_some();
        }
        any
    }

    fn decoder(&self) -> Decoder<'_> {
        Decoder {
            shape: Shape {
                hidden: HIDDEN,
                heads: HEADS,
                kv_heads: KV_HEADS,
                head_dim: HEAD_DIM,
                intermediate: INTER,
                vocab: VOCAB,
                eps: EPS,
                scale: 1.0 / (HEAD_DIM as f32).sqrt(),
                residual_scale: RESIDUAL_SCALE,
                rotary_dim: ROTARY,
                rope_scale: ROPE_SCALE,
                activation: self.activation,
            },
            layers: self
                .layers
                .iter()
                .map(|l| Layer {
                    input_norm: &l.input_norm,
                    q: l.q.linear(),
                    k: l.k.linear(),
                    v: l.v.linear(),
                    o: l.o.linear(),
                    q_norm: l.q_norm.as_deref(),
                    k_norm: l.k_norm.as_deref(),
                    attention_output_norm: l.attention_output_norm.as_deref(),
                    post_attention_norm: &l.post_norm,
                    mlp: match &l.moe {
                        None => Mlp::Dense(Expert { gate: l.gate.linear(), up: l.up.linear(), down: l.down.linear() }),
                        Some(m) => Mlp::Experts(Experts {
                            router: &m.router,
                            experts: m.experts.iter().map(expert).collect(),
                            top_k: m.top_k,
                            norm_topk_prob: m.norm,
                            shared: m.shared.as_ref().map(|(w, g)| (expert(w), g.as_slice())),
                        }),
                    },
                    mlp_output_norm: l.mlp_output_norm.as_deref(),
                    window: l.window,
                    rope: l.rope,
                    kv_group: l.kv_group,
                })
                .collect(),
            norm: &self.norm,
            head: self.head.linear(),
            inv_freqs: self.inv_freqs.iter().map(Vec::as_slice).collect(),
            long_inv_freq: self.long_inv_freq.as_deref(),
            precision: self.precision,
        }
    }

    /// Every position's logits of one sequence `x` (embedded rows), in float64.
    fn reference(&self, x: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let rms = |v: &[f64], w: &[f32]| {
            let scale = 1.0 / (v.iter().map(|a| a * a).sum::<f64>() / v.len() as f64 + EPS as f64).sqrt();
            v.iter().zip(w).map(|(a, &g)| a * scale * g as f64).collect::<Vec<f64>>()
        };
        let rope = |v: &mut [f64], p: usize, table: usize| {
            for head in v.chunks_exact_mut(HEAD_DIM) {
                for i in 0..ROTARY / 2 {
                    let freqs = match &self.long_inv_freq {
                        Some(long) if table == 0 && p >= self.long_from => long,
                        _ => &self.inv_freqs[table],
                    };
                    let angle = (p as f32 * freqs[i]) as f64;
                    let (cos, sin) = (angle.cos() * ROPE_SCALE as f64, angle.sin() * ROPE_SCALE as f64);
                    let (a, b) = (head[i], head[i + ROTARY / 2]);
                    head[i] = a * cos - b * sin;
                    head[i + ROTARY / 2] = b * cos + a * sin;
                }
            }
        };
        let mut x: Vec<Vec<f64>> = x.to_vec();
        for l in &self.layers {
            let (mut qs, mut ks, mut vs) = (vec![], vec![], vec![]);
            for (p, row) in x.iter().enumerate() {
                let h = rms(row, &l.input_norm);
                let (mut q, mut k) = (l.q.apply(&h), l.k.apply(&h));
                if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                    q = q.chunks(HEAD_DIM).flat_map(|c| rms(c, qn)).collect();
                    k = k.chunks(HEAD_DIM).flat_map(|c| rms(c, kn)).collect();
                }
                if let Some(table) = l.rope {
                    rope(&mut q, p, table);
                    rope(&mut k, p, table);
                }
                qs.push(q);
                ks.push(k);
                vs.push(l.v.apply(&h));
            }
            for p in 0..x.len() {
                let first = l.window.map_or(0, |w| (p + 1).saturating_sub(w));
                let mut attended = vec![0.0; HEADS * HEAD_DIM];
                for h in 0..HEADS {
                    let g = h / (HEADS / KV_HEADS);
                    let q = &qs[p][h * HEAD_DIM..(h + 1) * HEAD_DIM];
                    let scores: Vec<f64> = (first..=p)
                        .map(|j| {
                            let k = &ks[j][g * HEAD_DIM..(g + 1) * HEAD_DIM];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (HEAD_DIM as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let sum: f64 = weights.iter().sum();
                    for (j, w) in (first..=p).zip(&weights) {
                        for d in 0..HEAD_DIM {
                            attended[h * HEAD_DIM + d] += w / sum * vs[j][g * HEAD_DIM + d];
                        }
                    }
                }
                let mut o = l.o.apply(&attended);
                if let Some(w) = &l.attention_output_norm {
                    o = rms(&o, w);
                }
                x[p].iter_mut().zip(&o).for_each(|(a, b)| *a += b * RESIDUAL_SCALE as f64);
                let h = rms(&x[p], &l.post_norm);
                let mlp = |w: [&Weights; 3]| {
                    let (gate, up) = (w[0].apply(&h), w[1].apply(&h));
                    let act: Vec<f64> = gate
                        .iter()
                        .zip(&up)
                        .map(|(&g, u)| match self.activation {
                            Activation::Silu => g / (1.0 + (-g).exp()) * u,
                            Activation::GeluTanh => {
                                let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
                                0.5 * g * (1.0 + inner.tanh()) * u
                            }
                        })
                        .collect();
                    w[2].apply(&act)
                };
                let mut down = match &l.moe {
                    None => mlp([&l.gate, &l.up, &l.down]),
                    Some(m) => {
                        let logits: Vec<f64> = m
                            .router
                            .chunks(HIDDEN)
                            .map(|w| w.iter().zip(&h).map(|(&a, b)| a as f64 * b).sum())
                            .collect();
                        let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let total: f64 = logits.iter().map(|l| (l - max).exp()).sum();
                        let mut order: Vec<usize> = (0..logits.len()).collect();
                        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
                        let top = &order[..m.top_k];
                        let sum: f64 = top.iter().map(|&e| (logits[e] - max).exp() / total).sum();
                        let mut out = vec![0.0; HIDDEN];
                        for &e in top {
                            let w = (logits[e] - max).exp() / total / if m.norm { sum } else { 1.0 };
                            let [g, u, d] = &m.experts[e];
                            out.iter_mut().zip(mlp([g, u, d])).for_each(|(o, v)| *o += w * v);
                        }
                        if let Some(([g, u, d], gate)) = &m.shared {
                            let z: f64 = gate.iter().zip(&h).map(|(&a, b)| a as f64 * b).sum();
                            let scale = 1.0 / (1.0 + (-z).exp());
                            out.iter_mut().zip(mlp([g, u, d])).for_each(|(o, v)| *o += scale * v);
                        }
                        out
                    }
                };
                if let Some(w) = &l.mlp_output_norm {
                    down = rms(&down, w);
                }
                x[p].iter_mut().zip(&down).for_each(|(a, b)| *a += b * RESIDUAL_SCALE as f64);
            }
        }
        x.iter().map(|row| self.head.apply(&rms(row, &self.norm))).collect()
    }
}

/// Each layer's key and value caches, `SLOTS` slots.
fn caches() -> Vec<(Vec<f32>, Vec<f32>)> {
    (0..2).map(|_| (vec![f32::NAN; SLOTS * KV_HEADS * HEAD_DIM], vec![f32::NAN; SLOTS * KV_HEADS * HEAD_DIM])).collect()
}

/// One step over `caches`: `tokens` are `(sequence, position)`, the
/// sequences' keys at `slots[s][p]`; returns the logits of every token.
fn step(
    model: &Model,
    path: Path,
    threads: usize,
    caches: &mut [(Vec<f32>, Vec<f32>)],
    embedded: &[&[f64]],
    tokens: &[(usize, usize)],
    slots: &[Vec<i64>],
) -> Result<Vec<f32>, StepError> {
    let key_slots: Vec<i64> = slots.iter().flatten().copied().collect();
    let seq_start = |s: usize| slots[..s].iter().map(Vec::len).sum::<usize>() as i64;
    let mut x: Vec<f32> =
        tokens.iter().flat_map(|&(s, p)| embedded[s][p * HIDDEN..(p + 1) * HIDDEN].iter().map(|&v| v as f32)).collect();
    let positions: Vec<i64> = tokens.iter().map(|&(_, p)| p as i64).collect();
    // A position past its sequence's slots (a bad step's) writes to slot 5.
    let slot_mapping: Vec<i64> = tokens.iter().map(|&(s, p)| slots[s].get(p).copied().unwrap_or(5)).collect();
    let key_starts: Vec<i64> = tokens.iter().map(|&(s, _)| seq_start(s)).collect();
    let logits_rows: Vec<i64> = (0..tokens.len() as i64).collect();
    let long_rope: Vec<u8> = tokens.iter().map(|&(_, p)| u8::from(p >= model.long_from)).collect();
    let mut logits = vec![0.0f32; tokens.len() * VOCAB];
    let mut layer_caches: Vec<LayerCache<'_>> =
        caches.iter_mut().map(|(k, v)| LayerCache { keys: KvCacheMut::F32(k), values: KvCacheMut::F32(v) }).collect();
    let inputs = StepInputs {
        positions: &positions,
        slot_mapping: &slot_mapping,
        key_starts: &key_starts,
        key_slots: &key_slots,
        logits_rows: &logits_rows,
        long_rope: model.long_inv_freq.is_some().then_some(long_rope.as_slice()),
        groups: &[],
    };
    model.decoder().forward(path, &mut x, &mut layer_caches, &inputs, &mut logits, threads)?;
    Ok(logits)
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g as f64 - w).abs() <= 2e-4 * (1.0 + w.abs()), "{what}: logit {i} is {g}, the reference {w}");
    }
}

#[test]
fn prefill_then_decodes_equal_the_reference_on_every_path() {
    prefill_then_decodes_equal_the_reference(&Model::new(1));
}

#[test]
fn long_rope_tokens_rotate_by_the_long_table() {
    // Positions from 4 on past the "original context": the decodes at 6..9
    // rotate by the long table, the prefill's first keys by the short one.
    let mut model = Model::new(9);
    model.long_inv_freq = Some(inv_freq(10000.0).iter().map(|f| f / 3.0).collect());
    model.long_from = 4;
    prefill_then_decodes_equal_the_reference(&model);
}

#[test]
fn a_layer_of_a_second_kv_group_reads_and_writes_its_own_slots() {
    // Layer 0 (windowed) keeps its keys in a cache of 8 slots of its own,
    // at slots of its own; layer 1 in the first group's 64.
    let mut model = Model::gemma(11);
    model.layers[0].kv_group = 1;
    let mut rng = Rng(12);
    let embedded: Vec<f64> = floats(&mut rng, 6 * HIDDEN, 1.0).iter().map(|&v| v as f64).collect();
    let want = model.reference(&embedded.chunks(HIDDEN).map(<[f64]>::to_vec).collect::<Vec<_>>());
    let (first, second): (Vec<i64>, Vec<i64>) = (vec![17, 3, 40, 41, 42, 9], vec![5, 1, 7, 2, 6, 0]);
    let row = KV_HEADS * HEAD_DIM;
    let (mut k0, mut v0) = (vec![f32::NAN; 8 * row], vec![f32::NAN; 8 * row]);
    let (mut k1, mut v1) = (vec![f32::NAN; SLOTS * row], vec![f32::NAN; SLOTS * row]);
    let mut caches = vec![
        LayerCache { keys: KvCacheMut::F32(&mut k0), values: KvCacheMut::F32(&mut v0) },
        LayerCache { keys: KvCacheMut::F32(&mut k1), values: KvCacheMut::F32(&mut v1) },
    ];
    let decoder = model.decoder();
    for (range, rows) in [(0..4, vec![3i64]), (4..6, vec![0, 1])] {
        let positions: Vec<i64> = range.clone().map(|p| p as i64).collect();
        let mut x: Vec<f32> = embedded[range.start * HIDDEN..range.end * HIDDEN].iter().map(|&v| v as f32).collect();
        let mut logits = vec![0.0f32; rows.len() * VOCAB];
        let groups = [GroupSlots { slot_mapping: &second[range.clone()], key_slots: &second[..range.end] }];
        let inputs = StepInputs {
            positions: &positions,
            slot_mapping: &first[range.clone()],
            key_starts: &vec![0; range.len()],
            key_slots: &first[..range.end],
            logits_rows: &rows,
            long_rope: None,
            groups: &groups,
        };
        decoder.forward(Path::best(), &mut x, &mut caches, &inputs, &mut logits, 2).unwrap();
        for (i, &r) in rows.iter().enumerate() {
            let p = range.start + r as usize;
            assert_close(&logits[i * VOCAB..(i + 1) * VOCAB], &want[p], &format!("position {p}"));
        }
    }
    let no_groups = StepInputs {
        positions: &[0],
        slot_mapping: &[0],
        key_starts: &[0],
        key_slots: &[0],
        logits_rows: &[0],
        long_rope: None,
        groups: &[],
    };
    let err = decoder.forward(Path::best(), &mut vec![0.0; HIDDEN], &mut caches, &no_groups, &mut [0.0; VOCAB], 1);
    assert_eq!(err.unwrap_err().to_string(), "layer 0 uses KV-cache group 1, but the step stages 1");
    drop(caches);
    for slot in 0..8 {
        let written = k0[slot * row..(slot + 1) * row].iter().all(|v| !v.is_nan());
        assert_eq!(written, second.contains(&(slot as i64)), "slot {slot} of the second group's cache");
    }
    assert!(k1[..row].iter().all(|v| v.is_nan()), "slot 0 of the first group's cache was never written");
}

#[test]
fn routed_experts_equal_the_reference_on_every_path() {
    prefill_then_decodes_equal_the_reference(&Model::moe(13, false));
    prefill_then_decodes_equal_the_reference(&Model::moe(14, true));
}

#[test]
fn gemma3_layers_equal_the_reference_on_every_path() {
    prefill_then_decodes_equal_the_reference(&Model::gemma(7));
}

/// A prefill of 6 tokens, then 3 decodes, on every path and 1 to 3 threads.
fn prefill_then_decodes_equal_the_reference(model: &Model) {
    model.decoder().check().unwrap();
    let mut rng = Rng(2);
    let embedded: Vec<f64> = floats(&mut rng, 9 * HIDDEN, 1.0).iter().map(|&v| v as f64).collect();
    let rows: Vec<Vec<f64>> = embedded.chunks(HIDDEN).map(<[f64]>::to_vec).collect();
    let want = model.reference(&rows);
    // Scattered slots, as a block table gives them.
    let slots = vec![vec![17, 3, 40, 41, 42, 9, 60, 61, 2]];
    for path in paths() {
        for threads in 1..=3 {
            let mut cache = caches();
            let prefill: Vec<(usize, usize)> = (0..6).map(|p| (0, p)).collect();
            let logits = step(model, path, threads, &mut cache, &[&embedded], &prefill, &slots).unwrap();
            for p in 0..6 {
                assert_close(
                    &logits[p * VOCAB..(p + 1) * VOCAB],
                    &want[p],
                    &format!("{path:?} x{threads} prefill {p}"),
                );
            }
            for (p, want) in want.iter().enumerate().skip(6) {
                let logits = step(model, path, threads, &mut cache, &[&embedded], &[(0, p)], &slots).unwrap();
                assert_close(&logits, want, &format!("{path:?} x{threads} decode {p}"));
            }
        }
    }
}

#[test]
fn int8_activations_reach_the_products_int8_runs_names_within_their_bound() {
    // Q8_0 weights: at Int8Activations every projection and the head of a
    // step whose row count `int8_runs` names (at most INT8_FEW_ROWS tokens;
    // on an AVX-512 VNNI CPU also the panels' many) quantize their
    // activations, each within about 0.4% of its exact product, so the
    // logits move, but stay within 5e-2 (1 + |logit|) of the reference (over
    // the 40 tokens' logits a logit of 0.25 came out 0.040 off). Other steps
    // multiply exactly, bit for bit.
    const TOKENS: usize = 40;
    let mut model = Model::of(5, QuantType::Q8_0);
    let mut rng = Rng(6);
    let embedded: Vec<f64> = floats(&mut rng, TOKENS * HIDDEN, 1.0).iter().map(|&v| v as f64).collect();
    let want = model.reference(&embedded.chunks(HIDDEN).map(<[f64]>::to_vec).collect::<Vec<_>>());
    let slots = vec![(0..TOKENS as i64).map(|s| s + 8).collect::<Vec<_>>()];
    for path in paths() {
        for count in [INT8_FEW_ROWS, INT8_FEW_ROWS + 2, TOKENS] {
            let tokens: Vec<(usize, usize)> = (0..count).map(|p| (0, p)).collect();
            let mut run = |precision| {
                model.precision = precision;
                step(&model, path, 2, &mut caches(), &[&embedded], &tokens, &slots).unwrap()
            };
            let (exact, int8) = (run(Precision::Exact), run(Precision::Int8Activations));
            if !int8_runs(path, count) {
                assert_eq!(int8, exact, "{path:?}: a step of {count} tokens is exact");
                continue;
            }
            assert_ne!(int8, exact, "{path:?}: the precision reached no product of a step of {count}");
            if count == TOKENS && path == Path::Avx512 {
                // Repacked at load, every product of every step runs at int8,
                // and the many rows' give the per-call panels' bits.
                let mut packed = Model::of(5, QuantType::Q8_0);
                if packed.pack() {
                    packed.precision = Precision::Int8Activations;
                    let got = step(&packed, path, 2, &mut caches(), &[&embedded], &tokens, &slots).unwrap();
                    assert_eq!(got, int8, "packed weights, {count} tokens");
                    let few = &tokens[..INT8_FEW_ROWS + 2];
                    let mid = step(&packed, path, 2, &mut caches(), &[&embedded], few, &slots).unwrap();
                    model.precision = Precision::Exact;
                    let exact_mid = step(&model, path, 2, &mut caches(), &[&embedded], few, &slots).unwrap();
                    assert_ne!(mid, exact_mid, "packed weights reach a step of {} tokens", few.len());
                    for (p, want) in want.iter().enumerate().take(few.len()) {
                        for (&g, &w) in mid[p * VOCAB..(p + 1) * VOCAB].iter().zip(want) {
                            assert!((g as f64 - w).abs() <= 5e-2 * (1.0 + w.abs()), "packed, token {p}: {g}, {w}");
                        }
                    }
                }
            }
            for (p, want) in want.iter().enumerate().take(count) {
                for (i, (&g, &w)) in int8[p * VOCAB..(p + 1) * VOCAB].iter().zip(want).enumerate() {
                    assert!(
                        (g as f64 - w).abs() <= 5e-2 * (1.0 + w.abs()),
                        "{path:?} {count} tokens, token {p} logit {i}: {g}, the reference {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn two_sequences_in_one_step_equal_each_alone() {
    let model = Model::new(3);
    let mut rng = Rng(4);
    let a: Vec<f64> = floats(&mut rng, 5 * HIDDEN, 1.0).iter().map(|&v| v as f64).collect();
    let b: Vec<f64> = floats(&mut rng, 4 * HIDDEN, 1.0).iter().map(|&v| v as f64).collect();
    let want_a = model.reference(&a.chunks(HIDDEN).map(<[f64]>::to_vec).collect::<Vec<_>>());
    let want_b = model.reference(&b.chunks(HIDDEN).map(<[f64]>::to_vec).collect::<Vec<_>>());
    let slots = vec![vec![0, 1, 2, 3, 4], vec![30, 31, 32, 33]];
    let mut cache = caches();
    // a's first 4 positions alone, then a's decode beside b's whole prefill.
    let first: Vec<(usize, usize)> = (0..4).map(|p| (0, p)).collect();
    step(&model, Path::best(), 2, &mut cache, &[&a, &b], &first, &slots).unwrap();
    let mixed = [(0, 4), (1, 0), (1, 1), (1, 2), (1, 3)];
    let logits = step(&model, Path::best(), 2, &mut cache, &[&a, &b], &mixed, &slots).unwrap();
    assert_close(&logits[..VOCAB], &want_a[4], "a's decode");
    for p in 0..4 {
        assert_close(&logits[(p + 1) * VOCAB..(p + 2) * VOCAB], &want_b[p], &format!("b's prefill {p}"));
    }
}

#[test]
fn a_bad_step_is_refused_before_the_cache_is_written() {
    let model = Model::new(5);
    let embedded = vec![0.5f64; 2 * HIDDEN];
    let refuse = |tokens: &[(usize, usize)], slots: Vec<Vec<i64>>| {
        let mut cache = caches();
        let err = step(&model, Path::best(), 1, &mut cache, &[&embedded], tokens, &slots).unwrap_err();
        assert!(cache.iter().all(|(k, v)| k.iter().chain(v).all(|x| x.is_nan())), "the cache was written");
        err.to_string()
    };
    assert_eq!(
        refuse(&[(0, 0), (0, 1)], vec![vec![0, SLOTS as i64]]),
        "key_slots[1] = 64 is outside the cache's 64 slots"
    );
    assert_eq!(refuse(&[(0, 0), (0, 1)], vec![vec![0]]), "token 1: keys 0..=0+1 are outside key_slots' 1 slots");
    let mut bad = model.decoder();
    bad.layers[1].window = Some(0);
    assert_eq!(bad.check().unwrap_err().to_string(), "layer 1: a sliding window of 0 keys");
    let mut bad = model.decoder();
    bad.shape.kv_heads = 3;
    assert!(bad.check().unwrap_err().to_string().contains("heads must be a positive multiple of kv_heads"));
    let mut bad = model.decoder();
    bad.layers[0].rope = Some(1);
    assert_eq!(bad.check().unwrap_err().to_string(), "layer 0: RoPE table 1, but the model has 1");
    let mut bad = model.decoder();
    if let Mlp::Dense(d) = &mut bad.layers[0].mlp {
        d.up.in_features = 32;
    }
    assert_eq!(bad.check().unwrap_err().to_string(), "layer 0 up is 96 x 32, the model needs 96 x 64");
}
