//! AVX2 product of a packed Q8_0 row group (see `packed_q8`) with one to
//! four activation rows (16-bit planes split at `NARROW`, or 8-bit ones,
//! `BYTE`).
//!
//! Per block, each 32-byte chunk holds four consecutive signed weights of
//! the eight rows. The low plane (`0..=127`) multiplies them directly with
//! `maddubs` (skipped for `BYTE` rows, whose low plane is zero); the high
//! plane (signed, `−127..=127`) goes through the sign trick, `|w|` times
//! the plane word with `w`'s sign. Both give 16-bit pair sums of at most
//! `2 · 128 · 127`, widened to 32 bits by `madd` at once, so the block sums
//! are exact.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use super::avx2_i8::load32;
use super::avx2_packed::word;
use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::packed_q8::{Q8Input, Q8_PACKED_BLOCK_BYTES};
use crate::cpu::kernels::qact::{BLOCK, BYTE, NARROW};

/// The eight outputs of one packed group for `T` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn tile<const SHIFT: u32, const T: usize>(group: &[u8], xs: &[Q8Input<'_, SHIFT>]) -> [__m256; T] {
    let xs: [Q8Input<'_, SHIFT>; T] = std::array::from_fn(|t| xs[t]);
    let nb = xs[0].x.d.len();
    let his = xs.map(|x| &x.x.hi.as_chunks::<BLOCK>().0[..nb]);
    let los = xs.map(|x| &x.x.lo.as_chunks::<BLOCK>().0[..nb]);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); T];
    let blocks = group[..nb * Q8_PACKED_BLOCK_BYTES]
        .as_chunks::<Q8_PACKED_BLOCK_BYTES>()
        .0;
    let mut ahead = super::prefetch::Streams::new(group, 1, T);
    for (i, blk) in blocks.iter().enumerate() {
        ahead.next(Q8_PACKED_BLOCK_BYTES);
        if T > 1 {
            super::prefetch::block_into_l1(blk, Q8_PACKED_BLOCK_BYTES);
        }
        let mut sum_hi = [_mm256_setzero_si256(); T];
        let mut sum_lo = [_mm256_setzero_si256(); T];
        for j in 0..BLOCK / 4 {
            let w = load32(&blk[16 + 32 * j..]);
            let w_abs = _mm256_abs_epi8(w);
            for t in 0..T {
                let h = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(word(&his[t][i], 4 * j), w));
                sum_hi[t] = _mm256_add_epi32(sum_hi[t], _mm256_madd_epi16(h, ones));
                if SHIFT != BYTE {
                    let l = _mm256_maddubs_epi16(word(&los[t][i], 4 * j), w);
                    sum_lo[t] = _mm256_add_epi32(sum_lo[t], _mm256_madd_epi16(l, ones));
                }
            }
        }
        let d = scales(blk);
        for t in 0..T {
            acc[t] = add_block::<SHIFT>(acc[t], d, sum_hi[t], sum_lo[t], xs[t].x.d[i]);
        }
    }
    acc
}

/// The eight rows' f16 scales of a packed block, as f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn scales(blk: &[u8; Q8_PACKED_BLOCK_BYTES]) -> __m256 {
    let b = &blk[..16];
    // SAFETY: `b` holds 16 bytes (sliced above) and `loadu` has no
    // alignment requirement.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(b.as_ptr().cast()) })
}

/// `acc` plus a block's contribution to the eight rows from their exact
/// plane sums split at `SHIFT`: `fma(2^SHIFT·hi + lo, d·dx, acc)`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn add_block<const SHIFT: u32>(
    acc: __m256,
    d: __m256,
    hi: __m256i,
    lo: __m256i,
    dx: f32,
) -> __m256 {
    debug_assert!(SHIFT == NARROW || SHIFT == BYTE);
    let p = if SHIFT == BYTE {
        hi
    } else {
        _mm256_add_epi32(_mm256_slli_epi32::<{ NARROW as i32 }>(hi), lo)
    };
    let scale = _mm256_mul_ps(d, _mm256_set1_ps(dx));
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc)
}

super::avx2_packed::packed_group_dot!("avx2,fma,f16c", [const SHIFT: u32], Q8Input<'_, SHIFT>);
