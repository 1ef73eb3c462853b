//! `vllm_rs._core.DecoderStack`: a Llama-family model's weights (GGUF blocks
//! or float16/bfloat16 rows, read in place) and its KV cache, held by the
//! kernels' `Decoder`, so that one call runs a whole step
//! (`engine/worker/native_step.py` builds it from a loaded model).

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use vllm_rs_kernels::{
    Activation, Decoder, Expert, Experts, GroupSlots, KvCacheMut, Layer, LayerCache, Linear, Mlp, Packed, Path,
    Precision, QuantType, Shape, StepInputs,
};

use crate::kernels::{check_out, flat_for, quant_type_for, slice, slice_mut, span};

const NAME: &str = "DecoderStack";

/// A linear layer as Python passes it: `(ggml type id, rows (uint8), out
/// features, in features, bias (float32) or None)`.
#[derive(FromPyObject)]
struct LinearArg<'py>(u32, Bound<'py, PyAny>, usize, usize, Option<Bound<'py, PyAny>>);

/// A layer as Python passes it: `(input_norm, post_attention_norm, q_norm
/// or None, k_norm or None, [q, k, v, o, gate, up, down], window or None,
/// its RoPE table (an index into `inv_freqs`) or None, attention_output_norm
/// or None, mlp_output_norm or None, its KV-cache group, its routed experts
/// or None)`; with experts, the linear layers are q, k, v and o only.
#[derive(FromPyObject)]
struct LayerArg<'py>(
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
    Option<Bound<'py, PyAny>>,
    Vec<LinearArg<'py>>,
    Option<usize>,
    Option<usize>,
    Option<Bound<'py, PyAny>>,
    Option<Bound<'py, PyAny>>,
    usize,
    Option<ExpertsArg<'py>>,
);

/// A layer's routed experts as Python passes them: `(router (float32
/// [experts, hidden]), [[gate, up, down] of each expert], top_k,
/// norm_topk_prob, ([gate, up, down], gate weights (float32 [hidden])) of
/// the shared expert or None)`.
#[derive(FromPyObject)]
struct ExpertsArg<'py>(
    Bound<'py, PyAny>,
    Vec<Vec<LinearArg<'py>>>,
    usize,
    bool,
    Option<(Vec<LinearArg<'py>>, Bound<'py, PyAny>)>,
);

/// The exported buffers a `DecoderStack` reads; held so that their memory
/// stays valid (and unmoved) as long as the stack lives.
#[derive(Default)]
struct Exports {
    bytes: Vec<PyBuffer<u8>>,
    floats: Vec<PyBuffer<f32>>,
    /// Whether each linear layer is also repacked for the int8 path (the
    /// stack multiplies at int8).
    pack: bool,
    /// The repacked layers.
    packed: PackedLayers,
}

/// Repacked layers from `Box::into_raw` (so that no owner moves them while
/// the decoder reads them through `&'static` references), freed on drop.
#[derive(Default)]
struct PackedLayers(Vec<*mut Packed>);

impl Drop for PackedLayers {
    fn drop(&mut self) {
        for p in self.0.drain(..) {
            // SAFETY: from Box::into_raw, freed once; the decoder that read
            // it is dropped before its exports (DecoderStack's field order).
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

// SAFETY: the layers are only read once made, by whichever thread runs the
// stack; `Packed` holds plain vectors.
unsafe impl Send for PackedLayers {}
// SAFETY: as Send: shared references only read.
unsafe impl Sync for PackedLayers {}

impl Exports {
    /// `obj`'s floats for the stack's lifetime.
    fn floats(&mut self, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<&'static [f32]> {
        let buf = flat_for::<f32>(NAME, obj, name, "float32")?;
        // SAFETY: the export is kept in `self` (owned by the stack) until the
        // stack is dropped, and the stack never hands the slice out.
        let s: &'static [f32] = unsafe { std::mem::transmute::<&[f32], &'static [f32]>(slice(&buf)) };
        self.floats.push(buf);
        Ok(s)
    }

    /// `obj`'s bytes for the stack's lifetime.
    fn bytes(&mut self, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<&'static [u8]> {
        let buf = flat_for::<u8>(NAME, obj, name, "uint8")?;
        // SAFETY: as `floats`.
        let s: &'static [u8] = unsafe { std::mem::transmute::<&[u8], &'static [u8]>(slice(&buf)) };
        self.bytes.push(buf);
        Ok(s)
    }

    /// A gated MLP's `[gate, up, down]`.
    fn expert(&mut self, args: &[LinearArg<'_>], name: &str) -> PyResult<Expert<'static>> {
        let [gate, up, down] = args else {
            return Err(PyValueError::new_err(format!(
                "{NAME}: {name} has {} linear layers, not 3 (gate, up, down)",
                args.len()
            )));
        };
        Ok(Expert {
            gate: self.linear(gate, &format!("{name} gate"))?,
            up: self.linear(up, &format!("{name} up"))?,
            down: self.linear(down, &format!("{name} down"))?,
        })
    }

    /// A layer's routed experts.
    fn experts(&mut self, arg: &ExpertsArg<'_>, name: &str) -> PyResult<Experts<'static>> {
        let ExpertsArg(router, experts, top_k, norm_topk_prob, shared) = arg;
        let shared = match shared {
            Some((linears, gate)) => Some((
                self.expert(linears, &format!("{name} shared expert"))?,
                self.floats(gate, &format!("{name} shared expert gate"))?,
            )),
            None => None,
        };
        Ok(Experts {
            router: self.floats(router, &format!("{name} router"))?,
            experts: experts
                .iter()
                .enumerate()
                .map(|(e, linears)| self.expert(linears, &format!("{name} expert {e}")))
                .collect::<PyResult<_>>()?,
            top_k: *top_k,
            norm_topk_prob: *norm_topk_prob,
            shared,
        })
    }

    fn linear(&mut self, arg: &LinearArg<'_>, name: &str) -> PyResult<Linear<'static>> {
        let LinearArg(quant, rows, out_features, in_features, bias) = arg;
        let bias = bias.as_ref().map(|b| self.floats(b, &format!("{name} bias"))).transpose()?;
        let (quant, rows) = (quant_type_for(NAME, *quant)?, self.bytes(rows, name)?);
        Ok(Linear {
            quant,
            rows,
            out_features: *out_features,
            in_features: *in_features,
            bias,
            packed: self.packed(quant, rows, *out_features, *in_features),
        })
    }

    /// `rows` repacked for the int8 path where the stack multiplies at int8
    /// and this CPU and type repack (`Packed::new`), for the stack's lifetime.
    fn packed(&mut self, quant: QuantType, rows: &[u8], n: usize, k: usize) -> Option<&'static Packed> {
        if !self.pack {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let raw = Box::into_raw(Box::new(Packed::new(quant, rows, n, k)?));
            self.packed.0.push(raw);
            // SAFETY: freed only when `self` (owned by the stack) is dropped,
            // after the decoder that holds this reference.
            Some(unsafe { &*raw })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (quant, rows, n, k);
            None
        }
    }
}

/// One layer's KV cache halves, written by the stack's steps: float32
/// values, or 16-bit ones (`float16`/`bfloat16` bits, as uint16 buffers).
enum CacheExport {
    F32(PyBuffer<f32>, PyBuffer<f32>),
    F16(PyBuffer<u16>, PyBuffer<u16>),
    Bf16(PyBuffer<u16>, PyBuffer<u16>),
}

impl CacheExport {
    fn new(dtype: &str, keys: &Bound<'_, PyAny>, values: &Bound<'_, PyAny>, i: usize) -> PyResult<CacheExport> {
        let (kn, vn) = (format!("layer {i} keys"), format!("layer {i} values"));
        let floats = |obj, name: &str| flat_for::<f32>(NAME, obj, name, "float32");
        let bits = |obj, name: &str| flat_for::<u16>(NAME, obj, name, "uint16 (16-bit cache values)");
        let export = match dtype {
            "float32" => CacheExport::F32(floats(keys, &kn)?, floats(values, &vn)?),
            "float16" => CacheExport::F16(bits(keys, &kn)?, bits(values, &vn)?),
            "bfloat16" => CacheExport::Bf16(bits(keys, &kn)?, bits(values, &vn)?),
            other => {
                return Err(PyValueError::new_err(format!(
                    "{NAME}: cache_dtype {other:?} is not float32, float16 or bfloat16"
                )))
            }
        };
        let readonly = match &export {
            CacheExport::F32(k, v) => k.readonly() || v.readonly(),
            CacheExport::F16(k, v) | CacheExport::Bf16(k, v) => k.readonly() || v.readonly(),
        };
        if readonly {
            return Err(PyValueError::new_err(format!("{NAME}: layer {i}'s cache is read-only")));
        }
        Ok(export)
    }

    /// The layer's cache, to write.
    ///
    /// # Safety
    /// As `slice_mut`: no other slice of these buffers is alive meanwhile.
    unsafe fn layer(&self) -> LayerCache<'_> {
        // SAFETY: the caller's promise.
        unsafe {
            match self {
                CacheExport::F32(k, v) => {
                    LayerCache { keys: KvCacheMut::F32(slice_mut(k)), values: KvCacheMut::F32(slice_mut(v)) }
                }
                CacheExport::F16(k, v) => {
                    LayerCache { keys: KvCacheMut::F16(slice_mut(k)), values: KvCacheMut::F16(slice_mut(v)) }
                }
                CacheExport::Bf16(k, v) => {
                    LayerCache { keys: KvCacheMut::Bf16(slice_mut(k)), values: KvCacheMut::Bf16(slice_mut(v)) }
                }
            }
        }
    }
}

/// A model's decoder layers, final norm and output head, with its KV cache
/// (one `(keys, values)` pair of arrays `[slots, kv_heads, head_dim]` per
/// layer, written in place: float32, or uint16 holding `cache_dtype`'s
/// float16/bfloat16 bits), run a step at a time by `forward`. Raises TypeError for a buffer of the wrong type, ValueError
/// for shapes that do not fit together.
#[pyclass(module = "vllm_rs._core")]
pub struct DecoderStack {
    decoder: Decoder<'static>,
    caches: Vec<CacheExport>,
    _exports: Exports,
}

#[pymethods]
impl DecoderStack {
    /// `shape` is `(hidden, heads, kv_heads, head_dim, intermediate, vocab,
    /// eps, scale, residual_scale, rotary_dim, rope_scale)`; `inv_freqs` the
    /// RoPE tables the layers use; `layers` as `LayerArg` says; `head` a linear as
    /// `LinearArg` says; `caches` one `(keys, values)` per layer, of
    /// `cache_dtype` (`float32`, `float16` or `bfloat16`); `precision`
    /// `exact` (the float path) or `int8` (int8 activations in the products
    /// whose row counts `int8_runs` names, see `Precision::Int8Activations`
    /// for its error bound); `activation` the
    /// MLP gate's, `silu` or `gelu_tanh`; `long_inv_freq` LongRoPE's long
    /// factors' table, which the tokens `forward`'s `long_rope` flags use.
    #[new]
    #[pyo3(signature = (
        shape, inv_freqs, layers, norm, head, caches, cache_dtype = "float32", precision = "exact", activation = "silu",
        long_inv_freq = None
    ))]
    // Python's constructor: its arguments are the keyword arguments callers see.
    #[allow(clippy::too_many_arguments)]
    fn new(
        shape: (usize, usize, usize, usize, usize, usize, f32, f32, f32, usize, f32),
        inv_freqs: Vec<Bound<'_, PyAny>>,
        layers: Vec<LayerArg<'_>>,
        norm: &Bound<'_, PyAny>,
        head: LinearArg<'_>,
        caches: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)>,
        cache_dtype: &str,
        precision: &str,
        activation: &str,
        long_inv_freq: Option<Bound<'_, PyAny>>,
    ) -> PyResult<DecoderStack> {
        let activation = match activation {
            "silu" => Activation::Silu,
            "gelu_tanh" => Activation::GeluTanh,
            other => {
                return Err(PyValueError::new_err(format!(
                    "{NAME}: activation {other:?} is not \"silu\" or \"gelu_tanh\""
                )))
            }
        };
        let precision = match precision {
            "exact" => Precision::Exact,
            "int8" => Precision::Int8Activations,
            other => {
                return Err(PyValueError::new_err(format!("{NAME}: precision {other:?} is not \"exact\" or \"int8\"")))
            }
        };
        let (
            hidden,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab,
            eps,
            scale,
            residual_scale,
            rotary_dim,
            rope_scale,
        ) = shape;
        let mut exports = Exports { pack: precision == Precision::Int8Activations, ..Default::default() };
        let mut built = Vec::with_capacity(layers.len());
        for (i, layer) in layers.iter().enumerate() {
            let LayerArg(
                input_norm,
                post_norm,
                q_norm,
                k_norm,
                linears,
                window,
                rope,
                attention_out,
                mlp_out,
                kv_group,
                experts,
            ) = layer;
            let name = |what: &str| format!("layer {i} {what}");
            // With routed experts the MLP comes apart from the linear layers.
            let wanted = if experts.is_some() { "4 (q, k, v, o)" } else { "7 (q, k, v, o, gate, up, down)" };
            let (attention, dense) = linears.split_at(linears.len().min(4));
            let ([q, k, v, o], true) = (attention, dense.len() == if experts.is_some() { 0 } else { 3 }) else {
                return Err(PyValueError::new_err(format!(
                    "{NAME}: layer {i} has {} linear layers, not {wanted}",
                    linears.len()
                )));
            };
            let mlp = match experts {
                Some(e) => Mlp::Experts(exports.experts(e, &format!("layer {i}"))?),
                None => Mlp::Dense(exports.expert(dense, &format!("layer {i}"))?),
            };
            built.push(Layer {
                input_norm: exports.floats(input_norm, &name("input_norm"))?,
                q: exports.linear(q, &name("q"))?,
                k: exports.linear(k, &name("k"))?,
                v: exports.linear(v, &name("v"))?,
                o: exports.linear(o, &name("o"))?,
                q_norm: q_norm.as_ref().map(|n| exports.floats(n, &name("q_norm"))).transpose()?,
                k_norm: k_norm.as_ref().map(|n| exports.floats(n, &name("k_norm"))).transpose()?,
                attention_output_norm: attention_out
                    .as_ref()
                    .map(|n| exports.floats(n, &name("attention_output_norm")))
                    .transpose()?,
                post_attention_norm: exports.floats(post_norm, &name("post_attention_norm"))?,
                mlp,
                mlp_output_norm: mlp_out.as_ref().map(|n| exports.floats(n, &name("mlp_output_norm"))).transpose()?,
                window: *window,
                rope: *rope,
                kv_group: *kv_group,
            });
        }
        let decoder = Decoder {
            shape: Shape {
                hidden,
                heads,
                kv_heads,
                head_dim,
                intermediate,
                vocab,
                eps,
                scale,
                residual_scale,
                rotary_dim,
                rope_scale,
                activation,
            },
            layers: built,
            norm: exports.floats(norm, "norm")?,
            head: exports.linear(&head, "head")?,
            inv_freqs: inv_freqs
                .iter()
                .enumerate()
                .map(|(i, table)| exports.floats(table, &format!("inv_freqs[{i}]")))
                .collect::<PyResult<_>>()?,
            long_inv_freq: long_inv_freq.as_ref().map(|t| exports.floats(t, "long_inv_freq")).transpose()?,
            precision,
        };
        decoder.check().map_err(|e| PyValueError::new_err(format!("{NAME}: {e}")))?;
        let mut held = Vec::with_capacity(caches.len());
        for (i, (keys, values)) in caches.iter().enumerate() {
            held.push(CacheExport::new(cache_dtype, keys, values, i)?);
        }
        Ok(DecoderStack { decoder, caches: held, _exports: exports })
    }

    /// Runs one step: `x` (float32 `[tokens, hidden]`, the embedded tokens;
    /// overwritten) through every layer, the keys and values written to the
    /// cache at `slot_mapping`, then the logits of `logits_rows` into
    /// `logits` (float32 `[rows, vocab]`). `positions`, `slot_mapping` and
    /// `key_starts` are int64 `[tokens]`; token t's key at position p is in
    /// slot `key_slots[key_starts[t] + p]`; `long_rope` (uint8 `[tokens]`,
    /// optional) marks the tokens rotated by `long_inv_freq`; `group_slots`
    /// KV-cache groups 1, 2, ...'s `(slot_mapping, key_slots)`, laid out as
    /// the first group's. On `threads` threads, the GIL released. Raises
    /// ValueError for a bad shape or index (nothing written then).
    #[pyo3(signature = (
        x, positions, slot_mapping, key_starts, key_slots, logits_rows, logits, threads, long_rope = None,
        group_slots = Vec::new()
    ))]
    #[allow(clippy::too_many_arguments)] // the Python signature: a step's buffers and threads
    fn forward(
        &mut self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        positions: &Bound<'_, PyAny>,
        slot_mapping: &Bound<'_, PyAny>,
        key_starts: &Bound<'_, PyAny>,
        key_slots: &Bound<'_, PyAny>,
        logits_rows: &Bound<'_, PyAny>,
        logits: &Bound<'_, PyAny>,
        threads: usize,
        long_rope: Option<&Bound<'_, PyAny>>,
        group_slots: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)>,
    ) -> PyResult<()> {
        if threads == 0 {
            return Err(PyValueError::new_err(format!("{NAME}.forward: threads must be at least 1")));
        }
        let func = "DecoderStack.forward";
        let floats = |obj, name| flat_for::<f32>(func, obj, name, "float32");
        let ints = |obj, name| flat_for::<i64>(func, obj, name, "int64");
        let (xb, lb) = (floats(x, "x")?, floats(logits, "logits")?);
        let (pb, sb, kb, ksb, rb) = (
            ints(positions, "positions")?,
            ints(slot_mapping, "slot_mapping")?,
            ints(key_starts, "key_starts")?,
            ints(key_slots, "key_slots")?,
            ints(logits_rows, "logits_rows")?,
        );
        let flags = long_rope.map(|f| flat_for::<u8>(func, f, "long_rope", "uint8")).transpose()?;
        let groups = group_slots
            .iter()
            .enumerate()
            .map(|(g, (slots, keys))| {
                let g = g + 1;
                let int64 = |obj, name: String| flat_for::<i64>(func, obj, &name, "int64");
                Ok((int64(slots, format!("group {g} slot_mapping"))?, int64(keys, format!("group {g} key_slots"))?))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let mut inputs = vec![
            ("positions", span(&pb)),
            ("slot_mapping", span(&sb)),
            ("key_starts", span(&kb)),
            ("key_slots", span(&ksb)),
            ("logits_rows", span(&rb)),
        ];
        inputs.extend(flags.as_ref().map(|f| ("long_rope", span(f))));
        for (slots, keys) in &groups {
            inputs.extend([("group slot_mapping", span(slots)), ("group key_slots", span(keys))]);
        }
        check_out(func, &xb, &inputs)?;
        check_out(func, &lb, &[inputs.as_slice(), &[("x", span(&xb))]].concat())?;
        // SAFETY: the buffers stay exported until the end of this call; x and
        // logits overlap none of the others (checked above); the caches are
        // written only here, under `&mut self`, with the GIL released as any
        // numpy operation releases it.
        unsafe {
            let mut caches: Vec<LayerCache<'_>> = self.caches.iter().map(|c| c.layer()).collect();
            let group_views: Vec<GroupSlots<'_>> = groups
                .iter()
                .map(|(slots, keys)| GroupSlots { slot_mapping: slice(slots), key_slots: slice(keys) })
                .collect();
            let step = StepInputs {
                positions: slice(&pb),
                slot_mapping: slice(&sb),
                key_starts: slice(&kb),
                key_slots: slice(&ksb),
                logits_rows: slice(&rb),
                long_rope: flags.as_ref().map(|f| slice(f)),
                groups: &group_views,
            };
            let (xs, ls) = (slice_mut(&xb), slice_mut(&lb));
            let decoder = &self.decoder;
            py.detach(|| decoder.forward(Path::best(), xs, &mut caches, &step, ls, threads))
        }
        .map_err(|e| PyValueError::new_err(format!("{func}: {e}")))
    }
}

/// Adds `DecoderStack` to `vllm_rs._core`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DecoderStack>()
}
