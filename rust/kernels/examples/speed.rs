//! Times the kernel alone (no Python): `cargo run --release -p vllm-rs-kernels
//! --example speed -- [M] [N] [K] [TYPE (Q8_0, Q4_K, ...)] [threads]
//! [exact|int8|packed] [PATH (Scalar, Avx2, Avx512)]`; prints
//! milliseconds per call and the weight bytes read per second, for each path.
//! On a shared machine the wall clock counts the time other processes held
//! the CPU, so the figures are from the thread's own on-CPU time (Linux's
//! `/proc/thread-self/schedstat`), the wall clock beside them.

use std::time::Instant;

use vllm_rs_kernels::{matmuls, Dims, Matmul, Packed, Path, Precision, QuantType};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: usize| args.get(i).map_or(default, |a| a.parse().expect("a number"));
    let (m, n, k) = (num(0, 1), num(1, 49152), num(2, 576));
    let name = args.get(3).map_or("Q8_0", String::as_str);
    let quant = QuantType::ALL.into_iter().find(|q| q.name() == name).expect("a type name: Q8_0, Q4_K, IQ4_NL, ...");
    let threads = num(4, 1);
    let mode = args.get(5).map_or("exact", String::as_str);
    let precision = match mode {
        "exact" => Precision::Exact,
        "int8" | "packed" => Precision::Int8Activations,
        other => panic!("precision {other:?} is not exact, int8 or packed"),
    };
    // Blocks with scale 2^-8 (f16 0x1c00) and varied quants.
    let mut w = vec![0u8; n * quant.row_bytes(k)];
    for (i, block) in w.chunks_exact_mut(quant.block_bytes()).enumerate() {
        block[0] = 0x00;
        block[1] = 0x1c;
        for (j, b) in block[2..].iter_mut().enumerate() {
            *b = (i * 31 + j * 7) as u8;
        }
    }
    let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect();
    // `packed`: the weights repacked once, as a layer holds them at int8.
    let packed = (mode == "packed").then(|| Packed::new(quant, &w, n, k).expect("this CPU and type repack"));
    let call = |path, y: &mut [f32]| {
        let dims = Dims { m, n, k };
        matmuls(path, precision, &mut [Matmul { quant, x: &x, w: &w, y, dims, packed: packed.as_ref() }], threads)
    };
    let mut y = vec![0.0f32; m * n];
    let only = args.get(6);
    for path in Path::supported().into_iter().filter(|p| only.is_none_or(|o| format!("{p:?}") == *o)) {
        call(path, &mut y).unwrap();
        // At least 0.3 s of calls: schedstat advances at the scheduler's ticks.
        let (start, cpu_start) = (Instant::now(), on_cpu_secs());
        let mut reps = 0u32;
        while reps < 3 || start.elapsed().as_secs_f64() < 0.3 {
            call(path, &mut y).unwrap();
            reps += 1;
        }
        let wall = start.elapsed().as_secs_f64() / f64::from(reps);
        let secs = cpu_start.map_or(wall, |c0| on_cpu_secs().map_or(wall, |c1| (c1 - c0) / f64::from(reps)));
        println!(
            "{path:?} {precision:?} {quant:?} m={m} n={n} k={k} threads={threads}: {:.3} ms on CPU ({:.3} wall), {:.2} GB/s of weights, {:.1} GFLOP/s",
            secs * 1e3,
            wall * 1e3,
            w.len() as f64 / secs / 1e9,
            2.0 * (m * n * k) as f64 / secs / 1e9
        );
    }
}

/// Seconds this thread has run on a CPU (None where Linux's schedstat is missing).
fn on_cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(stat.split_whitespace().next()?.parse::<f64>().ok()? / 1e9)
}
