//! The f32 vector steps of the tiled attention kernels, at two widths with
//! the same names: [`w256`] (eight lanes, AVX2 + FMA) and [`w512`] (sixteen
//! lanes, AVX-512F). `tiled`'s vector kernels are written once against
//! these names, and each width gives every lane the same operations, so
//! both widths give the same bits.
//!
//! Every function is a safe `#[target_feature]` function: callers must
//! have detected the module's features.

/// Eight f32 lanes on AVX2 + FMA.
pub(super) mod w256 {
    use std::arch::x86_64::*;

    /// One vector of floats.
    pub(in super::super) type V = __m256;
    /// One vector of `i32`.
    pub(in super::super) type I = __m256i;
    /// Floats per vector, and the loads and stores of `simd::avx2`.
    pub(in super::super) use crate::cpu::kernels::simd::avx2::{load, store, LANES};

    /// All lanes zero.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in super::super) fn zero() -> V {
        _mm256_setzero_ps()
    }

    /// The first [`LANES`] integers of `s`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in super::super) fn load_i32(s: &[i32]) -> I {
        let s = &s[..LANES];
        // SAFETY: `s` holds LANES i32; `loadu` has no alignment requirement.
        unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
    }

    /// `x` in every lane.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in super::super) fn splat(x: f32) -> V {
        _mm256_set1_ps(x)
    }

    /// `x` in every lane.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in super::super) fn splat_i32(x: i32) -> I {
        _mm256_set1_epi32(x)
    }

    /// `a · b + c`, fused.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in super::super) fn fma(a: V, b: V, c: V) -> V {
        _mm256_fmadd_ps(a, b, c)
    }

    /// `a · b`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in super::super) fn mul(a: V, b: V) -> V {
        _mm256_mul_ps(a, b)
    }

    /// `a + b`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in super::super) fn add(a: V, b: V) -> V {
        _mm256_add_ps(a, b)
    }

    /// `a − b`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in super::super) fn sub(a: V, b: V) -> V {
        _mm256_sub_ps(a, b)
    }

    /// Lane-wise maximum.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in super::super) fn max(a: V, b: V) -> V {
        _mm256_max_ps(a, b)
    }

    /// `e^x` (see `vmath::exp8`).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in super::super) fn exp(x: V) -> V {
        crate::cpu::kernels::simd::vmath::exp8(x)
    }

    /// `c` with `-inf` in the lanes where `pos < lo` or `pos > hi`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in super::super) fn hide_outside(c: V, pos: I, lo: I, hi: I) -> V {
        let out = _mm256_or_si256(_mm256_cmpgt_epi32(lo, pos), _mm256_cmpgt_epi32(pos, hi));
        _mm256_blendv_ps(
            c,
            _mm256_set1_ps(f32::NEG_INFINITY),
            _mm256_castsi256_ps(out),
        )
    }

    /// `x`, with `+0` in the lanes where it is `-inf`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in super::super) fn finite_or_zero(x: V) -> V {
        let none = _mm256_cmp_ps::<_CMP_EQ_OQ>(x, _mm256_set1_ps(f32::NEG_INFINITY));
        _mm256_andnot_ps(none, x)
    }
}

/// Sixteen f32 lanes on AVX-512F.
pub(super) mod w512 {
    use std::arch::x86_64::*;

    /// One vector of floats.
    pub(in super::super) type V = __m512;
    /// One vector of `i32`.
    pub(in super::super) type I = __m512i;
    /// Floats per vector, and the loads and stores of `simd::avx512`.
    pub(in super::super) use crate::cpu::kernels::simd::avx512::{load, store, LANES};

    /// All lanes zero.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    pub(in super::super) fn zero() -> V {
        _mm512_setzero_ps()
    }

    /// The first [`LANES`] integers of `s`.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    pub(in super::super) fn load_i32(s: &[i32]) -> I {
        let s = &s[..LANES];
        // SAFETY: `s` holds LANES i32; `loadu` has no alignment requirement.
        unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
    }

    /// `x` in every lane.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    pub(in super::super) fn splat(x: f32) -> V {
        _mm512_set1_ps(x)
    }

    /// `x` in every lane.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    pub(in super::super) fn splat_i32(x: i32) -> I {
        _mm512_set1_epi32(x)
    }

    /// `a · b + c`, fused.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    pub(in super::super) fn fma(a: V, b: V, c: V) -> V {
        _mm512_fmadd_ps(a, b, c)
    }

    /// `a · b`.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    pub(in super::super) fn mul(a: V, b: V) -> V {
        _mm512_mul_ps(a, b)
    }

    /// `a + b`.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    pub(in super::super) fn add(a: V, b: V) -> V {
        _mm512_add_ps(a, b)
    }

    /// `a − b`.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    pub(in super::super) fn sub(a: V, b: V) -> V {
        _mm512_sub_ps(a, b)
    }

    /// Lane-wise maximum.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    pub(in super::super) fn max(a: V, b: V) -> V {
        _mm512_max_ps(a, b)
    }

    /// `e^x` (see `vmath::exp16`).
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    pub(in super::super) fn exp(x: V) -> V {
        crate::cpu::kernels::simd::vmath::exp16(x)
    }

    /// `c` with `-inf` in the lanes where `pos < lo` or `pos > hi`.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    pub(in super::super) fn hide_outside(c: V, pos: I, lo: I, hi: I) -> V {
        let out = _mm512_cmpgt_epi32_mask(lo, pos) | _mm512_cmpgt_epi32_mask(pos, hi);
        _mm512_mask_blend_ps(out, c, _mm512_set1_ps(f32::NEG_INFINITY))
    }

    /// `x`, with `+0` in the lanes where it is `-inf`.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    pub(in super::super) fn finite_or_zero(x: V) -> V {
        let none = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_set1_ps(f32::NEG_INFINITY));
        _mm512_maskz_mov_ps(!none, x)
    }
}
