//! Vectorized elementary functions for the AVX2 kernels.
//!
//! Safe `#[target_feature]` functions: callers must have detected AVX2 and
//! FMA.

use std::arch::x86_64::*;

/// `e^x` for 8 lanes: `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2`, `e^r` by
/// its Taylor series to degree 7 (relative error below 1e-7 before
/// rounding), times `2^n` built in the exponent bits. Inputs below −87
/// give 0 or the smallest normal numbers; there is no overflow check
/// (softmax inputs are ≤ 0).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn exp8(x: __m256) -> __m256 {
    let x = _mm256_max_ps(x, _mm256_set1_ps(-88.0));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    // ln 2 split in two so that n·LN2_HI is exact.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.0 / 5040.0);
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    let e = _mm256_max_epi32(e, _mm256_setzero_si256());
    _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e)))
}

/// `x · sigmoid(x)` for 8 lanes, with `e = e^{−|x|}` (never overflows):
/// `sigmoid(x) = 1 / (1 + e)` for `x ≥ 0` and `e / (1 + e)` otherwise.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn silu8(x: __m256) -> __m256 {
    let neg_abs = _mm256_or_ps(x, _mm256_set1_ps(-0.0));
    let e = exp8(neg_abs);
    let one = _mm256_set1_ps(1.0);
    let num = _mm256_blendv_ps(one, e, x);
    _mm256_div_ps(_mm256_mul_ps(x, num), _mm256_add_ps(one, e))
}
