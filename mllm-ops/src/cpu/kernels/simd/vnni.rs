//! AVX-512 VNNI integer dot products of Q8_0, Q4_0 and Q4_1 weight rows
//! with 8-bit activations: `dpbusd` (unsigned × signed bytes summed in
//! groups of four into 32-bit lanes), two weight blocks per 512-bit vector.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA, AVX-512F, AVX-512BW and
//! AVX-512 VNNI (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2_i8::{load32, nibbles};
use crate::cpu::kernels::qact::{Int8Type, Q8Row, BLOCK};
use crate::quant::{q4_0, q4_1, q8_0};

/// Lanes 0..8 from `lo`, lanes 8..16 from `hi`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
#[inline]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// The weight bytes of blocks `i` and `i + 1` (zeros past the last block)
/// and the matching activation bytes, one block per 256-bit half.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
#[inline]
fn pair(weights: [__m256i; 2], xq: &[u8], i: usize, two: bool) -> (__m512i, __m512i) {
    let x0 = load32(&xq[i * BLOCK..]);
    if two {
        (
            join(weights[0], weights[1]),
            join(x0, load32(&xq[(i + 1) * BLOCK..])),
        )
    } else {
        (
            _mm512_zextsi256_si512(weights[0]),
            _mm512_zextsi256_si512(x0),
        )
    }
}

/// Per-lane block scales: `s0` in lanes 0..8, `s1` in lanes 8..16.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
#[inline]
fn scales(s0: f32, s1: f32) -> __m512 {
    _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s0), _mm512_set1_ps(s1))
}

/// Sixteen 32-bit sums of four products of unsigned bytes `a` with signed
/// bytes `b`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
#[inline]
fn dp_u8_i8(a: __m512i, b: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), a, b)
}

/// As [`dp_u8_i8`] for two signed operands: `|a| · (b negated where a < 0)`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
#[inline]
fn dp_i8_i8(a: __m512i, b: __m512i) -> __m512i {
    let negative = _mm512_movepi8_mask(a);
    let b = _mm512_mask_sub_epi8(b, negative, _mm512_setzero_si512(), b);
    dp_u8_i8(_mm512_abs_epi8(a), b)
}

/// The integer-path dot product of a weight row with an activation row
/// (see `qact::dot_i8` for the definition).
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
pub(crate) fn dot_i8(it: Int8Type, w: &[u8], x: Q8Row<'_>) -> f32 {
    let xq: &[u8] = bytemuck::cast_slice(x.q);
    let n = x.d.len();
    let mut acc = _mm512_setzero_ps();
    let mut offset = 0.0f32;
    let mut i = 0;
    // Scale of block `j` of the activations, 0 past the last block.
    let dx = |j: usize| x.d.get(j).copied().unwrap_or(0.0);
    match it {
        Int8Type::Q8_0 => {
            let blocks = w.as_chunks::<{ q8_0::BLOCK_BYTES }>().0;
            while i < n {
                let two = i + 1 < n;
                let b1 = &blocks[if two { i + 1 } else { i }];
                let (wv, xv) = pair([load32(&blocks[i][2..]), load32(&b1[2..])], xq, i, two);
                let s1 = if two {
                    q8_0::scale(b1) * dx(i + 1)
                } else {
                    0.0
                };
                let s = scales(q8_0::scale(&blocks[i]) * dx(i), s1);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp_i8_i8(wv, xv)), s, acc);
                i += 2;
            }
        }
        Int8Type::Q4_0 => {
            let blocks = w.as_chunks::<{ q4_0::BLOCK_BYTES }>().0;
            let eight = _mm512_set1_epi8(8);
            while i < n {
                let two = i + 1 < n;
                let b1 = &blocks[if two { i + 1 } else { i }];
                let (wv, xv) = pair([nibbles(&blocks[i][2..]), nibbles(&b1[2..])], xq, i, two);
                // Σ (q − 8)·x = Σ q·x − Σ 8·x, both as unsigned × signed.
                let p = _mm512_sub_epi32(dp_u8_i8(wv, xv), dp_u8_i8(eight, xv));
                let s1 = if two {
                    q4_0::scale(b1) * dx(i + 1)
                } else {
                    0.0
                };
                let s = scales(q4_0::scale(&blocks[i]) * dx(i), s1);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc);
                i += 2;
            }
        }
        Int8Type::Q4_1 => {
            let blocks = w.as_chunks::<{ q4_1::BLOCK_BYTES }>().0;
            while i < n {
                let two = i + 1 < n;
                let b1 = &blocks[if two { i + 1 } else { i }];
                let (wv, xv) = pair([nibbles(&blocks[i][4..]), nibbles(&b1[4..])], xq, i, two);
                let (d0, m0) = q4_1::scale_min(&blocks[i]);
                offset += m0 * x.s[i];
                let mut s1 = 0.0;
                if two {
                    let (d1, m1) = q4_1::scale_min(b1);
                    offset += m1 * x.s[i + 1];
                    s1 = d1 * dx(i + 1);
                }
                let s = scales(d0 * dx(i), s1);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp_u8_i8(wv, xv)), s, acc);
                i += 2;
            }
        }
    }
    _mm512_reduce_add_ps(acc) + offset
}
