//! The int8 path (`Precision::Int8Activations`) against references, for
//! each weight type it reads: every path within float32 rounding of a
//! float64 reference of its own arithmetic (the activations quantized as
//! the path quantizes them, times the dequantized weights), and within the
//! error bound its documentation states of the exact float64 product; the
//! types it does not read run the exact path.

mod blocks;
mod common;

use blocks::operands;
use common::paths;
use proptest::prelude::*;
use vllm_rs_kernels::{dequantize_row, int8_runs, matmul, Dims, Path, Precision, QuantType, INT8_FEW_ROWS};
#[cfg(target_arch = "x86_64")]
use vllm_rs_kernels::{matmuls, Matmul, Packed};

/// The types the int8 path reads.
const INT8_TYPES: [QuantType; 7] = [
    QuantType::Q8_0,
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q4K,
    QuantType::Q5K,
    QuantType::Q6K,
];

fn run(
    path: Path,
    precision: Precision,
    quant: QuantType,
    x: &[f32],
    w: &[u8],
    dims: Dims,
    threads: usize,
) -> Vec<f32> {
    let mut y = vec![f32::NAN; dims.m * dims.n];
    matmul(path, precision, quant, x, w, &mut y, dims, threads).unwrap();
    y
}

/// `x` as the int8 path sees it: each block of `block` rounded to the
/// multiples of `max|x| / 127`, back in float64.
fn quantized(x: &[f32], block: usize) -> Vec<f64> {
    x.chunks_exact(block)
        .flat_map(|xs| {
            let d = xs.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
            let inverse = if d == 0.0 { 0.0 } else { 1.0 / d };
            xs.iter().map(move |v| f64::from((v * inverse).round()) * f64::from(d))
        })
        .collect()
}

/// Each weight row dequantized, and the magnitudes the int8 arithmetic adds
/// per weight: `|w|`, but `|d q| + |m|` for the types with a minimum, the
/// two products it sums apart (the block with d made positive and the
/// minimum's sign set so that it adds: Q4_1's `m`, the K-quants' `-dmin`).
fn weight_rows(quant: QuantType, w: &[u8], k: usize) -> (Vec<f32>, Vec<f32>) {
    let mut values = vec![0.0f32; w.len() / quant.block_bytes() * quant.block_elems()];
    dequantize_row(quant, w, &mut values);
    let magnitudes = if matches!(quant, QuantType::Q4_1 | QuantType::Q4K | QuantType::Q5K) {
        let mut parts = w.to_vec();
        for block in parts.chunks_exact_mut(quant.block_bytes()) {
            block[1] &= 0x7f;
            if quant == QuantType::Q4_1 {
                block[3] &= 0x7f;
            } else {
                block[3] |= 0x80;
            }
        }
        let mut out = vec![0.0f32; values.len()];
        dequantize_row(quant, &parts, &mut out);
        out
    } else {
        values.iter().map(|v| v.abs()).collect()
    };
    assert_eq!(values.len() % k, 0);
    (values, magnitudes)
}

/// Checks `got` (int8 path) against the float64 product of the quantized
/// activations (within float32 rounding) and of the exact ones (within the
/// documented bound, `sum over blocks of max|x_b| / 254 * sum |w_b|`).
fn check(quant: QuantType, x: &[f32], w: &[u8], dims: Dims, got: &[f32]) {
    let Dims { m, n, k } = dims;
    let block = quant.block_elems();
    let xq = quantized(x, block);
    let (weights, magnitudes) = weight_rows(quant, w, k);
    for i in 0..m {
        for j in 0..n {
            let (xs, xqs) = (&x[i * k..(i + 1) * k], &xq[i * k..(i + 1) * k]);
            let (ws, mags) = (&weights[j * k..(j + 1) * k], &magnitudes[j * k..(j + 1) * k]);
            let own: f64 = xqs.iter().zip(ws).map(|(a, b)| a * f64::from(*b)).sum();
            let scale: f64 = xqs.iter().zip(mags).map(|(a, b)| (a * f64::from(*b)).abs()).sum();
            let rounding = scale * f64::from(f32::EPSILON) * (k as f64).sqrt() * 4.0 + 1e-30;
            let g = f64::from(got[i * n + j]);
            assert!((g - own).abs() <= rounding, "{quant:?} ({i}, {j}): {g} vs {own} (bound {rounding})");
            let exact: f64 = xs.iter().zip(ws).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
            let documented: f64 = xs
                .chunks_exact(block)
                .zip(ws.chunks_exact(block))
                .map(|(xb, wb)| {
                    let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                    f64::from(amax) / 254.0 * wb.iter().map(|v| f64::from(v.abs())).sum::<f64>()
                })
                .sum();
            assert!(
                (g - exact).abs() <= documented * 1.001 + rounding,
                "{quant:?} ({i}, {j}): {g} vs exact {exact} (bound {documented})"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_path_keeps_to_its_arithmetic_and_the_documented_bound(
        quant in prop::sample::select(INT8_TYPES.to_vec()),
        m in prop::sample::select(vec![1usize, 2, 3, 5, 33, 39]),
        n in 1usize..40,
        blocks in 1usize..6,
        threads in 1usize..4,
        seed in any::<u64>(),
    ) {
        let k = if quant.is_super_block() { blocks.div_ceil(2) } else { blocks } * quant.block_elems();
        let (x, w) = operands(quant, m, n, k, seed);
        for path in paths() {
            let got = run(path, Precision::Int8Activations, quant, &x, &w, Dims { m, n, k }, threads);
            if int8_runs(path, m) {
                check(quant, &x, &w, Dims { m, n, k }, &got);
            } else {
                prop_assert_eq!(got, run(path, Precision::Exact, quant, &x, &w, Dims { m, n, k }, threads));
            }
        }
    }
}

#[test]
fn a_1b_model_row_keeps_to_the_bound() {
    // A 1B Llama's K (2048), with one outlier activation per row, which sets its block's scale.
    for quant in INT8_TYPES {
        let (m, n, k) = (2, 64, 2048);
        let (mut x, w) = operands(quant, m, n, k, 23);
        x[5] = 40.0;
        x[k + 300] = -25.0;
        for path in paths() {
            check(
                quant,
                &x,
                &w,
                Dims { m, n, k },
                &run(path, Precision::Int8Activations, quant, &x, &w, Dims { m, n, k }, 2),
            );
        }
    }
}

#[test]
fn an_output_keeps_its_bits_whatever_the_batch_and_threads() {
    // Among calls that run one int8 code (few rows; the panels' many on an
    // AVX-512 VNNI CPU), a row's outputs do not depend on its place, its
    // neighbours or the thread split.
    for quant in INT8_TYPES {
        let (n, k) = (37, 512);
        let (x, w) = operands(quant, 45, n, k, 29);
        for path in paths() {
            for (m, threads, offset) in [(INT8_FEW_ROWS, 3, 1), (40, 3, 5)] {
                let all = run(path, Precision::Int8Activations, quant, &x[..m * k], &w, Dims { m, n, k }, threads);
                let shifted = &x[offset * k..(offset + m) * k];
                let other = run(path, Precision::Int8Activations, quant, shifted, &w, Dims { m, n, k }, 1);
                let one = run(
                    path,
                    Precision::Int8Activations,
                    quant,
                    &x[offset * k..(offset + 1) * k],
                    &w,
                    Dims { m: 1, n, k },
                    1,
                );
                for i in offset..m {
                    let at = i - offset;
                    assert_eq!(other[at * n..(at + 1) * n], all[i * n..(i + 1) * n], "{quant:?} {m} rows, row {i}");
                }
                if m <= INT8_FEW_ROWS {
                    assert_eq!(one, other[..n], "{quant:?} one row alone");
                }
            }
        }
    }
}

#[test]
fn types_it_does_not_read_run_the_exact_path() {
    for quant in QuantType::ALL.into_iter().filter(|q| !INT8_TYPES.contains(q)) {
        let (m, n, k) = (3, 19, 512);
        let (x, w) = operands(quant, m, n, k, 31);
        for path in paths() {
            let exact = run(path, Precision::Exact, quant, &x, &w, Dims { m, n, k }, 2);
            assert_eq!(run(path, Precision::Int8Activations, quant, &x, &w, Dims { m, n, k }, 2), exact, "{quant:?}");
        }
    }
}

#[test]
fn zero_activations_give_zero() {
    for quant in INT8_TYPES {
        let (n, k) = (5, 256);
        let (_, w) = operands(quant, 0, n, k, 37);
        for path in paths() {
            assert_eq!(
                run(path, Precision::Int8Activations, quant, &[0.0; 256], &w, Dims { m: 1, n, k }, 1),
                vec![0.0; n]
            );
        }
    }
}

/// `run` on weights repacked at load (`Packed`), as a layer holds them.
#[cfg(target_arch = "x86_64")]
fn run_packed(quant: QuantType, packed: &Packed, x: &[f32], w: &[u8], dims: Dims, threads: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; dims.m * dims.n];
    let call = Matmul { quant, x, w, y: &mut y, dims, packed: Some(packed) };
    matmuls(Path::Avx512, Precision::Int8Activations, &mut [call], threads).unwrap();
    y
}

#[cfg(target_arch = "x86_64")]
#[test]
fn packed_weights_keep_to_the_arithmetic_and_equal_the_panels_bit_for_bit() {
    // Every row count multiplies at int8 within the arithmetic's bound;
    // past decode's few rows on the repacked weights, where a row's outputs
    // do not depend on its batch or the threads, and from the panels' row
    // count on the panels decoded per call give the same bits (the same
    // integer sums, the same float32 order).
    for quant in INT8_TYPES {
        let (n, k) = (50, 512);
        let (x, w) = operands(quant, 40, n, k, 41);
        let Some(packed) = Packed::new(quant, &w, n, k) else {
            eprintln!("this CPU has no AVX-512 VNNI: nothing repacks");
            return;
        };
        // Past decode's few rows every product reads the repacked weights;
        // at few rows only the types whose blocks are slower to read.
        let many = INT8_FEW_ROWS + 1;
        let first = run_packed(quant, &packed, &x[..many * k], &w, Dims { m: many, n, k }, 1);
        for (m, threads) in [(1, 2), (3, 1), (5, 3), (40, 2)] {
            let dims = Dims { m, n, k };
            let got = run_packed(quant, &packed, &x[..m * k], &w, dims, threads);
            check(quant, &x[..m * k], &w, dims, &got);
            if m >= many {
                assert_eq!(got[..n], first[..n], "{quant:?}: row 0 of {m} rows against {many}");
            }
            if int8_runs(Path::Avx512, m) && m > INT8_FEW_ROWS {
                assert_eq!(
                    got,
                    run(Path::Avx512, Precision::Int8Activations, quant, &x[..m * k], &w, dims, 1),
                    "{quant:?}"
                );
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn packing_refuses_what_it_cannot_hold() {
    let (x, w) = operands(QuantType::Q8_0, 1, 4, 64, 43);
    let _ = x;
    assert!(Packed::new(QuantType::Q8_0, &w[..w.len() - 1], 4, 64).is_none(), "a short buffer");
    assert!(Packed::new(QuantType::Q8_0, &w, 4, 48).is_none(), "k not whole blocks");
    let (_, iq) = operands(QuantType::Iq4Nl, 1, 4, 64, 43);
    assert!(Packed::new(QuantType::Iq4Nl, &iq, 4, 64).is_none(), "a type the int8 path does not read");
}
