//! What the kernels' integration tests share.

use vllm_rs_kernels::Path;

/// The kernel paths this CPU can run: the scalar one always, the AVX2 one
/// where the CPU has AVX2, FMA and F16C (said on stderr where it has not).
pub fn paths() -> Vec<Path> {
    if Path::best() == Path::Avx2 {
        vec![Path::Scalar, Path::Avx2]
    } else {
        eprintln!("this CPU has no AVX2+FMA+F16C: only the scalar path is tested");
        vec![Path::Scalar]
    }
}
