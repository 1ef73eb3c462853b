//! The kernels against references, for each quant type: the AVX2 path (where
//! the CPU has it) against the scalar path, and both against "dequantize
//! each row, then a float64 dot product", on random blocks and shapes (odd M,
//! N; K a multiple of 32) and 1 to 4 threads.

mod common;

use common::{paths, Rng};
use proptest::prelude::*;
use vllm_rs_kernels::{check_shapes, dequantize_row, matmul, Dims, Path, QuantType, ShapeError, BLOCK};

const TYPES: [QuantType; 3] = [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1];

/// A random block: finite f16 scales in a realistic range, random quants.
fn block(quant: QuantType, rng: &mut Rng) -> Vec<u8> {
    let mut half = || {
        // Sign, exponent 5..=19 (about 2^-10 .. 2^4), random mantissa.
        let bits = (rng.below(2) << 15) | ((5 + rng.below(15)) << 10) | rng.below(1024);
        (bits as u16).to_le_bytes()
    };
    let mut out = half().to_vec();
    if quant == QuantType::Q4_1 {
        out.extend(half());
    }
    let rest = quant.block_bytes() - out.len();
    out.extend((0..rest).map(|_| rng.next() as u8));
    out
}

/// `x[m,k]` and `w` (n rows of blocks) from a seed.
fn operands(quant: QuantType, m: usize, n: usize, k: usize, seed: u64) -> (Vec<f32>, Vec<u8>) {
    let mut rng = Rng(seed);
    let x = (0..m * k).map(|_| rng.float()).collect();
    let w = (0..n * k / BLOCK).flat_map(|_| block(quant, &mut rng)).collect();
    (x, w)
}

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
    matmul(path, quant, x, w, &mut y, dims, threads).unwrap();
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
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_path_equals_the_dequantized_reference(
        quant in prop::sample::select(TYPES.to_vec()),
        m in 1usize..20,
        n in 1usize..40,
        blocks in 1usize..6,
        threads in 1usize..5,
        seed in any::<u64>(),
    ) {
        let k = blocks * BLOCK;
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
fn smollm2_shapes_agree_across_paths_and_threads() {
    for quant in TYPES {
        for (m, n, k) in [(1, 1536, 576), (16, 576, 1536), (5, 193, 576)] {
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
            let (n, k) = (70, 96);
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
    matmul(Path::best(), QuantType::Q8_0, &[1.0; 32], &w, &mut y, Dims { m: 1, n: 1, k: 32 }, 1).unwrap();
    assert_eq!(y[0], 248.0);
}

#[test]
fn mismatched_buffers_are_refused_not_read() {
    let mut y = [0.0; 2];
    let err =
        matmul(Path::best(), QuantType::Q4_0, &[0.0; 32], &[0; 18], &mut y, Dims { m: 1, n: 2, k: 32 }, 1).unwrap_err();
    assert_eq!(err, ShapeError::Len { what: "w", got: 18, need: 36, unit: "bytes", m: 1, n: 2, k: 32 });
    assert!(check_shapes(QuantType::Q4_0, 16, 9, 1, Dims { m: 1, n: 1, k: 16 }).is_err());
}
