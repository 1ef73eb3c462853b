//! A mixture-of-experts MLP in the decoder step (`engine/layers/moe.py`'s
//! arithmetic): a float32 router picks each token's top-k experts (softmax
//! over all of them, the k largest, renormalized to sum to 1 where the
//! model says), then only those experts run, each once over the rows routed
//! to it (gathered in token order), its outputs scaled by their routing
//! weights and added back in ascending expert order, as transformers' eager
//! experts loop adds them; Qwen2-MoE's shared expert, scaled by the sigmoid
//! of its own gate, is added last.

use crate::linear::{gated, product, Activation, Linear};
use crate::step_error::StepError;
use crate::{matmuls, Path, Precision};

/// One expert's SwiGLU (or GeGLU) projections.
#[derive(Debug, Clone, Copy)]
pub struct Expert<'a> {
    /// The gate projection.
    pub gate: Linear<'a>,
    /// The up projection.
    pub up: Linear<'a>,
    /// The down projection.
    pub down: Linear<'a>,
}

/// A layer's routed experts.
#[derive(Debug, Clone)]
pub struct Experts<'a> {
    /// The router's weights, float32 `[experts, hidden]`.
    pub router: &'a [f32],
    /// The experts, in the router's order.
    pub experts: Vec<Expert<'a>>,
    /// Experts each token runs.
    pub top_k: usize,
    /// Whether the top-k weights are renormalized to sum to 1.
    pub norm_topk_prob: bool,
    /// Qwen2-MoE's shared expert, which every token runs, and its gate's
    /// float32 weights (`[hidden]`: the sigmoid of that dot product scales it).
    pub shared: Option<(Expert<'a>, &'a [f32])>,
}

impl Experts<'_> {
    /// Checks the shapes against the model's width.
    pub(crate) fn check(&self, hidden: usize, what: &dyn Fn(&str) -> String) -> Result<(), StepError> {
        let n = self.experts.len();
        if n == 0 || self.top_k == 0 || self.top_k > n {
            return Err(StepError::Shape(format!(
                "{}: top_k = {} of {n} experts (at least one expert, and 1 <= top_k <= experts)",
                what("experts"),
                self.top_k
            )));
        }
        if self.router.len() != n * hidden {
            return Err(StepError::Len { what: what("router"), got: self.router.len(), need: n * hidden });
        }
        let experts = self.experts.iter().enumerate().map(|(e, x)| (format!("expert {e}"), x));
        let shared = self.shared.iter().map(|(x, _)| ("shared expert".to_string(), x));
        for (name, x) in experts.chain(shared) {
            let inter = x.gate.out_features;
            for (part, l, out, inp) in
                [("gate", &x.gate, inter, hidden), ("up", &x.up, inter, hidden), ("down", &x.down, hidden, inter)]
            {
                let whole = what(&format!("{name} {part}"));
                if (l.out_features, l.in_features) != (out, inp) {
                    return Err(StepError::Weight {
                        what: whole,
                        got_out: l.out_features,
                        got_in: l.in_features,
                        need_out: out,
                        need_in: inp,
                    });
                }
                let need = out * l.quant.row_bytes(inp);
                if l.rows.len() != need {
                    return Err(StepError::Len { what: format!("{whole} (bytes)"), got: l.rows.len(), need });
                }
            }
        }
        if let Some((_, gate)) = self.shared {
            if gate.len() != hidden {
                return Err(StepError::Len { what: what("shared expert gate"), got: gate.len(), need: hidden });
            }
        }
        Ok(())
    }

    /// The MoE output of each row of `h` (`[tokens, hidden]`) into `out`
    /// (as wide), on `path`, the products at `precision`.
    pub(crate) fn forward(
        &self,
        path: Path,
        precision: Precision,
        activation: Activation,
        h: &[f32],
        out: &mut [f32],
        threads: usize,
    ) -> Result<(), StepError> {
        let hidden = self.router.len() / self.experts.len();
        let tokens = h.len() / hidden;
        // (token, weight) pairs of each expert, tokens ascending.
        let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); self.experts.len()];
        for (t, row) in h.chunks_exact(hidden).enumerate() {
            for (e, w) in self.route(row) {
                routed[e].push((t, w));
            }
        }
        out.fill(0.0);
        for (expert, pairs) in self.experts.iter().zip(&routed) {
            if pairs.is_empty() {
                continue;
            }
            let mut x = Vec::with_capacity(pairs.len() * hidden);
            for &(t, _) in pairs {
                x.extend_from_slice(&h[t * hidden..(t + 1) * hidden]);
            }
            let y = expert.forward(path, precision, activation, &x, threads)?;
            for (&(t, w), row) in pairs.iter().zip(y.chunks_exact(hidden)) {
                out[t * hidden..(t + 1) * hidden].iter_mut().zip(row).for_each(|(o, &v)| *o += v * w);
            }
        }
        if let Some((shared, gate)) = &self.shared {
            let y = shared.forward(path, precision, activation, h, threads)?;
            for ((o, row), x) in out.chunks_exact_mut(hidden).zip(y.chunks_exact(hidden)).zip(h.chunks_exact(hidden)) {
                let g = 1.0 / (1.0 + (-dot(x, gate)).exp());
                o.iter_mut().zip(row).for_each(|(o, &v)| *o += g * v);
            }
        }
        debug_assert_eq!(out.len(), tokens * hidden);
        Ok(())
    }

    /// A row's experts and their weights, the largest first: softmax over
    /// the router's logits, the top k (the lower index first among equals,
    /// as torch's `topk` keeps them), renormalized where the model says.
    fn route(&self, row: &[f32]) -> Vec<(usize, f32)> {
        let hidden = row.len();
        let logits: Vec<f32> = self.router.chunks_exact(hidden).map(|w| dot(row, w)).collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
        let total: f32 = exps.iter().sum();
        let mut order: Vec<usize> = (0..exps.len()).collect();
        order.sort_by(|&a, &b| exps[b].total_cmp(&exps[a]).then(a.cmp(&b)));
        let mut top: Vec<(usize, f32)> = order[..self.top_k].iter().map(|&e| (e, exps[e] / total)).collect();
        if self.norm_topk_prob {
            let sum: f32 = top.iter().map(|&(_, w)| w).sum();
            top.iter_mut().for_each(|(_, w)| *w /= sum);
        }
        top
    }
}

impl Expert<'_> {
    /// `down(activation(gate(x)) * up(x))` of each row of `x`.
    fn forward(
        &self,
        path: Path,
        precision: Precision,
        activation: Activation,
        x: &[f32],
        threads: usize,
    ) -> Result<Vec<f32>, StepError> {
        let (hidden, inter) = (self.gate.in_features, self.gate.out_features);
        let m = x.len() / hidden;
        let (mut gate, mut up, mut y) = (vec![0.0f32; m * inter], vec![0.0f32; m * inter], vec![0.0f32; m * hidden]);
        self.forward_into(path, precision, activation, x, [&mut gate, &mut up], &mut y, threads, 1)?;
        Ok(y)
    }

    /// `y = down(activation(gate(x)) * up(x))` for the rows of `x`, with
    /// `scratch` (two buffers of rows x intermediate) holding the gate and
    /// up projections; the products on `threads`, the activation on
    /// `activation_threads`.
    // The operands of one MLP beside `matmuls`' settings and two thread counts.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward_into(
        &self,
        path: Path,
        precision: Precision,
        activation: Activation,
        x: &[f32],
        scratch: [&mut [f32]; 2],
        y: &mut [f32],
        threads: usize,
        activation_threads: usize,
    ) -> Result<(), StepError> {
        let m = x.len() / self.gate.in_features;
        let [gate, up] = scratch;
        matmuls(path, precision, &mut [product(&self.gate, x, gate, m), product(&self.up, x, up, m)], threads)?;
        gated(gate, up, activation, activation_threads);
        matmuls(path, precision, &mut [product(&self.down, gate, y, m)], threads)?;
        Ok(())
    }
}

/// `Σ a·b` in 8 float32 lanes, then the lanes (as `decoder`'s sums).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for ((lane, &x), &y) in lanes.iter_mut().zip(x).zip(y) {
            *lane += x * y;
        }
    }
    lanes.iter().sum::<f32>() + tail
}
