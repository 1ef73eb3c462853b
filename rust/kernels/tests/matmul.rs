//! The kernels against references, for each weight type: the SIMD paths
//! (where the CPU has them) against the scalar path, and all against
//! "dequantize each row, then a float64 dot product", on random blocks and
//! shapes (odd M, N; K a multiple of the type's block) and 1 to 4 threads.

mod blocks;
mod common;

use blocks::operands;
use common::paths;
use proptest::prelude::*;
use vllm_rs_kernels::{check_shapes, dequantize_row, matmul, Dims, Path, Precision, QuantType, ShapeError};

const TYPES: [QuantType; 14] = QuantType::ALL;

/// The reference: rows dequantized, dot products in float64; also the sum of
/// |x * w| of each output, which bounds float32 summation error.
fn reference(quant: QuantType, x: &[f32], w: &[u8], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let row_bytes = quant.row_bytes(k);
    let mut weights = vec![0.0f32; k];
    let (mut y, mut scale) = (vec![0.0; m * n], vec![0.0; m * n]);
    for j in 0..n {
        dequantize_row(quant, &w[j * row_bytes..(j + 1) * row_bytes], &mut weights);
        for i in 0..m {
            let xs = &x[i * k..(i + 1) * k];
            y[i * n + j] = xs.iter().zip(&weights).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
            scale[i * n + j] = xs.iter().zip(&weights).map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs()).sum();
        }
    }
    (y, scale)
}

fn run(path: Path, quant: QuantType, x: &[f32], w: &[u8], dims: Dims, threads: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; dims.m * dims.n];
    matmul(path, Precision::Exact, quant, x, w, &mut y, dims, threads).unwrap();
    y
}

/// Every output within float32 summation error of the float64 reference.
fn assert_close(got: &[f32], want: &[f64], scale: &[f64], k: usize) {
    for (idx, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        let bound = s * f64::from(f32::EPSILON) * (k as f64).sqrt() * 4.0 + 1e-30;
        assert!((f64::from(*g) - w).abs() <= bound, "output {idx}: {g} vs {w} (bound {bound})");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_path_equals_the_dequantized_reference(
        quant in prop::sample::select(TYPES.to_vec()),
        m in 1usize..20,
        n in 1usize..40,
        blocks in 1usize..6,
        threads in 1usize..5,
        seed in any::<u64>(),
    ) {
        // Super-blocks are 256 weights: one to three of them.
        let k = if quant.is_super_block() { blocks.div_ceil(2) } else { blocks } * quant.block_elems();
        let (x, w) = operands(quant, m, n, k, seed);
        let (want, scale) = reference(quant, &x, &w, m, n, k);
        let scalar = run(Path::Scalar, quant, &x, &w, Dims { m, n, k }, 1);
        assert_close(&scalar, &want, &scale, k);
        for path in paths() {
            let got = run(path, quant, &x, &w, Dims { m, n, k }, threads);
            assert_close(&got, &want, &scale, k);
        }
    }
}

#[test]
fn model_shapes_agree_across_paths_and_threads() {
    for quant in TYPES {
        // SmolLM2's rows (576, 1536) for the 32-weight blocks, a 1B model's
        // (2048, 8192 cut to 1024 here) for the super-blocks.
        let shapes = if quant.is_super_block() {
            [(1, 1024, 2048), (16, 256, 1024), (5, 193, 512)]
        } else {
            [(1, 1536, 576), (16, 576, 1536), (5, 193, 576)]
        };
        for (m, n, k) in shapes {
            let (x, w) = operands(quant, m, n, k, 7);
            let (want, scale) = reference(quant, &x, &w, m, n, k);
            for path in paths() {
                for threads in [1, 2, 3] {
                    assert_close(&run(path, quant, &x, &w, Dims { m, n, k }, threads), &want, &scale, k);
                }
            }
        }
    }
}

#[test]
fn one_thread_and_many_give_the_same_bits() {
    let (m, n, k) = (3, 77, 96);
    let (x, w) = operands(QuantType::Q4_1, m, n, k, 11);
    for path in paths() {
        assert_eq!(
            run(path, QuantType::Q4_1, &x, &w, Dims { m, n, k }, 1),
            run(path, QuantType::Q4_1, &x, &w, Dims { m, n, k }, 4)
        );
    }
}

#[test]
fn many_rows_give_the_same_bits_whatever_the_threads_and_row_order() {
    // Enough rows for the panel path; n not a multiple of the panel's 4 rows.
    for quant in TYPES {
        for m in [5, 16, 17] {
            let (n, k) = (70, if quant.is_super_block() { 512 } else { 96 });
            let (x, w) = operands(quant, m, n, k, 13);
            // The batch's rows reversed: each output row must keep its bits.
            let reversed: Vec<f32> = x.chunks_exact(k).rev().flatten().copied().collect();
            for path in paths() {
                let one = run(path, quant, &x, &w, Dims { m, n, k }, 1);
                assert_eq!(one, run(path, quant, &x, &w, Dims { m, n, k }, 3), "{quant:?} m={m}");
                let back = run(path, quant, &reversed, &w, Dims { m, n, k }, 2);
                let back: Vec<f32> = back.chunks_exact(n).rev().flatten().copied().collect();
                assert_eq!(one, back, "{quant:?} m={m}");
            }
        }
    }
}

#[test]
fn known_weights_give_known_products() {
    // One Q8_0 row: d = 0.5, q = 0..32; x = 1: y = 0.5 * sum(0..32) = 248.
    let mut w = vec![0x00, 0x38];
    w.extend(0..32u8);
    let mut y = [0.0];
    matmul(Path::best(), Precision::Exact, QuantType::Q8_0, &[1.0; 32], &w, &mut y, Dims { m: 1, n: 1, k: 32 }, 1)
        .unwrap();
    assert_eq!(y[0], 248.0);
}

#[test]
fn mismatched_buffers_are_refused_not_read() {
    let mut y = [0.0; 2];
    let err = matmul(
        Path::best(),
        Precision::Exact,
        QuantType::Q4_0,
        &[0.0; 32],
        &[0; 18],
        &mut y,
        Dims { m: 1, n: 2, k: 32 },
        1,
    )
    .unwrap_err();
    assert_eq!(err, ShapeError::Len { what: "w", got: 18, need: 36, unit: "bytes", m: 1, n: 2, k: 32 });
    assert!(check_shapes(QuantType::Q4_0, 16, 9, 1, Dims { m: 1, n: 1, k: 16 }).is_err());
}

#[test]
fn every_path_decodes_each_weight_to_the_reference_bits() {
    // x = the identity: y[i, j] = w[j, i] * 1 plus zeros, exact in float32
    // (all weights are finite),
    // so each output is one dequantized weight. k rows take the panels;
    // one row at a time (x = e_i) the register and super-block tiles.
    for quant in TYPES {
        let (n, k) = (9, quant.block_elems());
        let (_, w) = operands(quant, 0, n, k, 17);
        let mut want = vec![0.0f32; n * k];
        for (row, out) in w.chunks_exact(quant.row_bytes(k)).zip(want.chunks_exact_mut(k)) {
            dequantize_row(quant, row, out);
        }
        let identity: Vec<f32> = (0..k * k).map(|e| if e / k == e % k { 1.0 } else { 0.0 }).collect();
        for path in paths() {
            let panel = run(path, quant, &identity, &w, Dims { m: k, n, k }, 2);
            for i in 0..k {
                let tile = run(path, quant, &identity[i * k..(i + 1) * k], &w, Dims { m: 1, n, k }, 1);
                for j in 0..n {
                    // Compared as values: a weight of -0.0 sums to +0.0.
                    let reference = want[j * k + i];
                    assert_eq!(panel[i * n + j], reference, "{quant:?} {path:?} weight {j},{i} (panels)");
                    assert_eq!(tile[j], reference, "{quant:?} {path:?} weight {j},{i} (one row)");
                }
            }
        }
    }
}
