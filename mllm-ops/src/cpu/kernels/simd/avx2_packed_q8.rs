//! AVX2 product of a packed Q8_0 row group (see `packed_q8`) with one to
//! four activation rows (16-bit values split at `NARROW`, or 8-bit ones,
//! `BYTE`), on their 16-bit values (`Q8Input::values`).
//!
//! Per block, each 32-byte chunk holds four consecutive signed weights of
//! the eight rows; sign-extended to 16 bits they fill two registers (rows
//! 0-3 and 4-7), and `madd` with the row's four activation values
//! broadcast gives two 32-bit partial sums per weight row. No product can
//! overflow (`|w·q| ≤ 128 · 16383`), so the sums are the exact integers
//! `Σ w·q = 2^SHIFT·Σ w·hi + Σ w·lo` of the portable kernel. One `hadd` per
//! block and row joins the partial sums, leaving the rows in the order
//! 0, 1, 4, 5, 2, 3, 6, 7; the scales are put in that
//! order once per block, and each output once per tile back in its own.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use super::inline_array;
use crate::cpu::kernels::packed::{WeightReads, GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::packed_q8::{Q8Input, Q8_PACKED_BLOCK_BYTES};
use crate::cpu::kernels::qact::{BLOCK, BYTE, NARROW};

/// The row order of the joined block sums, as a lane permutation; it is
/// its own inverse.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn mixed_rows() -> __m256i {
    _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7)
}

/// The sixteen signed bytes at the start of `b` as 16-bit lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn widen16(b: &[u8]) -> __m256i {
    let b = &b[..16];
    // SAFETY: `b` holds 16 bytes (sliced above) and `loadu` has no
    // alignment requirement.
    _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(b.as_ptr().cast()) })
}

/// The four 16-bit values `q[0..4]` in every 64-bit lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn quad(q: &[i16]) -> __m256i {
    let word = |i: usize| q[i] as u16 as u64;
    _mm256_set1_epi64x((word(0) | word(1) << 16 | word(2) << 32 | word(3) << 48) as i64)
}

/// The eight outputs of one packed group for `T` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn tile<const SHIFT: u32, const T: usize>(
    group: &[u8],
    xs: &[Q8Input<'_, SHIFT>],
    reads: WeightReads,
) -> [__m256; T] {
    debug_assert!(SHIFT == NARROW || SHIFT == BYTE);
    let nb = xs[0].x.d.len();
    // Forced-inline maps (see `inline_array`): with `std::array` ones the
    // closures stayed calls, and one thread's products ran 1.08x slower.
    let values: [_; T] = inline_array::from_fn(|t| &xs[t].values.as_chunks::<BLOCK>().0[..nb]);
    let ds: [_; T] = inline_array::from_fn(|t| &xs[t].x.d[..nb]);
    let mixed = mixed_rows();
    let mut acc = [_mm256_setzero_ps(); T];
    let blocks = group[..nb * Q8_PACKED_BLOCK_BYTES]
        .as_chunks::<Q8_PACKED_BLOCK_BYTES>()
        .0;
    let mut ahead = super::prefetch::Streams::new(group, 1, reads);
    for (i, blk) in blocks.iter().enumerate() {
        ahead.next(Q8_PACKED_BLOCK_BYTES);
        super::prefetch::block_into_l1(blk, Q8_PACKED_BLOCK_BYTES);
        let mut rows03 = [_mm256_setzero_si256(); T];
        let mut rows47 = [_mm256_setzero_si256(); T];
        // A trip count the compiler cannot see keeps it from unrolling the
        // chunks and widening all sixteen weight registers up front, which
        // spilled them to the stack for three and four rows: one thread's
        // 128-row prefill ran 10 % faster without the spills.
        for j in 0..std::hint::black_box(BLOCK / 4) {
            let chunk = &blk[16 + 32 * j..16 + 32 * (j + 1)];
            let (w03, w47) = (widen16(&chunk[..16]), widen16(&chunk[16..]));
            for t in 0..T {
                let q = quad(&values[t][i][4 * j..]);
                rows03[t] = _mm256_add_epi32(rows03[t], _mm256_madd_epi16(w03, q));
                rows47[t] = _mm256_add_epi32(rows47[t], _mm256_madd_epi16(w47, q));
            }
        }
        let d = _mm256_permutevar8x32_ps(scales(blk), mixed);
        for t in 0..T {
            let p = _mm256_hadd_epi32(rows03[t], rows47[t]);
            acc[t] = add_sums(acc[t], d, p, ds[t][i]);
        }
    }
    acc.map(|a| _mm256_permutevar8x32_ps(a, mixed))
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
    add_sums(acc, d, p, dx)
}

/// `acc` plus a block's contribution to the eight rows from their exact
/// 32-bit block sums `p`: `fma(p, d·dx, acc)`, the float step every packed
/// Q8_0 kernel shares.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn add_sums(acc: __m256, d: __m256, p: __m256i, dx: f32) -> __m256 {
    let scale = _mm256_mul_ps(d, _mm256_set1_ps(dx));
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc)
}

super::avx2_packed::packed_group_dot!("avx2,fma,f16c", [const SHIFT: u32], Q8Input<'_, SHIFT>);
