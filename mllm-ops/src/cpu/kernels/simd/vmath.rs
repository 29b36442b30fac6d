//! Vectorized elementary functions for the AVX2 kernels, and their 16-lane
//! forms for the AVX-512 ones (the same operations lane by lane, so the
//! same bits).
//!
//! Safe `#[target_feature]` functions: callers must have detected AVX2 and
//! FMA (and AVX-512F for [`exp16`] and [`silu16`]).

use std::arch::x86_64::*;

/// ln 2 split in two so that `n · LN2_HI` is exact for the `n` of `exp`.
const LN2_HI: f32 = 0.693_359_4;
/// The rest of ln 2.
const LN2_LO: f32 = -2.121_944_4e-4;
/// The degree-7 coefficient of `e^r`'s Taylor series.
const TAYLOR_TOP: f32 = 1.0 / 5040.0;
/// The other coefficients, degree 6 down to 0, in Horner order.
const TAYLOR_LOWER: [f32; 7] = [
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

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
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(TAYLOR_TOP);
    for c in TAYLOR_LOWER {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    let e = _mm256_max_epi32(e, _mm256_setzero_si256());
    _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e)))
}

/// [`exp8`] for 16 lanes: the same operations lane by lane, so the same
/// bits.
#[target_feature(enable = "avx2,fma,avx512f")]
#[inline]
pub(crate) fn exp16(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(-88.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(TAYLOR_TOP);
    for c in TAYLOR_LOWER {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    let e = _mm512_max_epi32(e, _mm512_setzero_si512());
    _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e)))
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

/// [`silu8`] for 16 lanes: the same operations lane by lane (the sign bit
/// picks the numerator, as `blendv` does), so the same bits.
#[target_feature(enable = "avx2,fma,avx512f")]
#[inline]
pub(crate) fn silu16(x: __m512) -> __m512 {
    // The sign bit by integer operations: the float ones need AVX-512DQ.
    let sign = _mm512_set1_epi32(i32::MIN);
    let bits = _mm512_castps_si512(x);
    let e = exp16(_mm512_castsi512_ps(_mm512_or_si512(bits, sign)));
    let one = _mm512_set1_ps(1.0);
    let negative = _mm512_test_epi32_mask(bits, sign);
    let num = _mm512_mask_blend_ps(negative, one, e);
    _mm512_div_ps(_mm512_mul_ps(x, num), _mm512_add_ps(one, e))
}
