//! AVX2 integer dot products of Q8_0, Q4_0 and Q4_1 weight rows with 8-bit
//! activations: `maddubs` (unsigned × signed bytes to 16-bit pair sums) and
//! `madd` (to 32-bit), one weight block of 32 per 256-bit vector.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2 and FMA (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::hsum;
use crate::cpu::kernels::qact::{Int8Type, Q8Row, BLOCK};
use crate::quant::{q4_0, q4_1, q8_0};

/// The first 32 bytes of `b`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn load32(b: &[u8]) -> __m256i {
    let b = &b[..32];
    // SAFETY: `b` holds 32 bytes (sliced above) and `loadu` has no
    // alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// The 32 nibbles of the first 16 bytes of `b` in Q4 value order: low
/// nibbles of bytes 0..16, then their high nibbles.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn nibbles(b: &[u8]) -> __m256i {
    let b = &b[..16];
    // SAFETY: `b` holds 16 bytes (sliced above) and `loadu` has no
    // alignment requirement.
    let raw = unsafe { _mm_loadu_si128(b.as_ptr().cast()) };
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(raw), raw);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Eight 32-bit sums of four products of unsigned bytes `a` with signed
/// bytes `b` (the pair sums cannot saturate: `|a| ≤ 128`, `|b| ≤ 127`).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn madd_u8_i8(a: __m256i, b: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
}

/// As [`madd_u8_i8`] for two signed operands: `|a| · (b with a's sign)`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn madd_i8_i8(a: __m256i, b: __m256i) -> __m256i {
    madd_u8_i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a))
}

/// The integer-path dot product of a weight row with an activation row
/// (see `qact::dot_i8` for the definition).
#[target_feature(enable = "avx2,fma")]
pub(crate) fn dot_i8(it: Int8Type, w: &[u8], x: Q8Row<'_>) -> f32 {
    let xq: &[u8] = bytemuck::cast_slice(x.q);
    let xs = xq.chunks_exact(BLOCK).zip(x.d.iter().zip(x.s));
    let mut acc = _mm256_setzero_ps();
    let mut offset = 0.0f32;
    match it {
        Int8Type::Q8_0 => {
            for (b, (xb, (&dx, _))) in w.as_chunks::<{ q8_0::BLOCK_BYTES }>().0.iter().zip(xs) {
                let p = madd_i8_i8(load32(&b[2..]), load32(xb));
                let s = _mm256_set1_ps(q8_0::scale(b) * dx);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc);
            }
        }
        Int8Type::Q4_0 => {
            for (b, (xb, (&dx, _))) in w.as_chunks::<{ q4_0::BLOCK_BYTES }>().0.iter().zip(xs) {
                let q = _mm256_sub_epi8(nibbles(&b[2..]), _mm256_set1_epi8(8));
                let p = madd_i8_i8(q, load32(xb));
                let s = _mm256_set1_ps(q4_0::scale(b) * dx);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc);
            }
        }
        Int8Type::Q4_1 => {
            for (b, (xb, (&dx, &sx))) in w.as_chunks::<{ q4_1::BLOCK_BYTES }>().0.iter().zip(xs) {
                let (d, m) = q4_1::scale_min(b);
                let p = madd_u8_i8(nibbles(&b[4..]), load32(xb));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * dx), acc);
                offset += m * sx;
            }
        }
    }
    hsum(acc) + offset
}
