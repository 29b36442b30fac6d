//! AVX2 product of two consecutive packed Q4 row groups (see `packed`)
//! with up to [`TILE_TOKENS`] activation rows, a few per pass
//! ([`rows_per_pass`]): the one-group kernel's steps (`avx2_packed`), but
//! each broadcast activation word feeds a `maddubs` for both groups. The
//! block sums are the same integers and the float steps the same, so every
//! output has the one-group kernel's bits.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store_pair;
use super::avx2_i8::load32;
use super::avx2_packed::{
    add_block_sum, block_scales, split_nibbles, word, BlockPlanes, ByteConsts, RowPlanes,
};
use crate::cpu::kernels::packed::{
    WeightReads, GROUP_ROWS, NIBBLES_AT, PACKED_BLOCK_BYTES, TILE_TOKENS,
};
use crate::cpu::kernels::qact::{Q16Row, BYTE, WIDE};

/// Activation rows per pass over a pair of groups for rows split at
/// `shift`: two 16-bit rows (their block sums over two planes, two groups
/// and two rows take eight registers, the four unpacked nibble registers
/// and a broadcast five more; three rows spill and ran slower), or the
/// whole tile of 8-bit rows (one plane: eight sums for four rows).
/// Measured on a Zen 3 core with one thread, best of 400 calls of a
/// 1536 x 576 Q4_1 layer over 128 rows: 16-bit rows 48.0 GMAC/s with the
/// one-group kernel, 50.1 with two rows per pass, 46.3 with three; 8-bit
/// rows 75.3, 81.0 with two and 87.0 with four.
const fn rows_per_pass(shift: u32) -> usize {
    if shift == BYTE {
        TILE_TOKENS
    } else {
        2
    }
}

/// The outputs of two consecutive packed groups `a` and `b` for one to
/// [`TILE_TOKENS`] activation rows: `out[t]` for `a`, `out[xs.len() + t]`
/// for `b`. One row (decode) goes through each group alone, the one-group
/// kernel streaming one group at a time.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn pair_dot<const SHIFT: u32>(
    a: &[u8],
    b: &[u8],
    xs: &[Q16Row<'_, SHIFT>],
    out: &mut [[f32; GROUP_ROWS]],
    reads: WeightReads,
) {
    let rows = xs.len();
    debug_assert!(rows <= TILE_TOKENS && out.len() >= 2 * rows);
    let (out_a, out_b) = out.split_at_mut(rows);
    if rows == 1 {
        super::avx2_packed::group_dot(a, xs, out_a, reads);
        super::avx2_packed::group_dot(b, xs, out_b, reads);
        return;
    }
    let per_pass = rows_per_pass(SHIFT);
    for (i, xs) in xs.chunks(per_pass).enumerate() {
        let reads = reads.of_pass(i);
        let at = i * per_pass;
        let out = (&mut out_a[at..], &mut out_b[at..]);
        match xs.len() {
            1 => store_pair(pair_tile::<1, SHIFT>(a, b, xs, reads), out),
            2 => store_pair(pair_tile::<2, SHIFT>(a, b, xs, reads), out),
            3 => store_pair(pair_tile::<3, SHIFT>(a, b, xs, reads), out),
            _ => store_pair(pair_tile::<4, SHIFT>(a, b, xs, reads), out),
        }
    }
}

/// The eight outputs of each of the groups `a` and `b` for `T` activation
/// rows.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn pair_tile<const T: usize, const SHIFT: u32>(
    a: &[u8],
    b: &[u8],
    xs: &[Q16Row<'_, SHIFT>],
    reads: WeightReads,
) -> [[__m256; T]; 2] {
    let xs: [Q16Row<'_, SHIFT>; T] = std::array::from_fn(|t| xs[t]);
    let nb = xs[0].d.len();
    let planes = RowPlanes::new(xs, nb, ByteConsts::new());
    let mut acc = [[_mm256_setzero_ps(); T]; 2];
    let len = nb * PACKED_BLOCK_BYTES;
    let blocks_a = a[..len].as_chunks::<PACKED_BLOCK_BYTES>().0;
    let blocks_b = b[..len].as_chunks::<PACKED_BLOCK_BYTES>().0;
    let mut ahead = super::prefetch::Streams::new(a, 2, reads);
    for (i, (ka, kb)) in blocks_a.iter().zip(blocks_b).enumerate() {
        ahead.next(PACKED_BLOCK_BYTES);
        super::prefetch::block_into_l1(ka, PACKED_BLOCK_BYTES);
        super::prefetch::block_into_l1(kb, PACKED_BLOCK_BYTES);
        let sums = pair_block_sums(&ka[NIBBLES_AT..], &kb[NIBBLES_AT..], planes.block(i));
        let x = planes.scales(i);
        for ((acc, sums), blk) in acc.iter_mut().zip(sums).zip([ka, kb]) {
            let scales = block_scales(blk);
            for t in 0..T {
                acc[t] = add_block_sum(acc[t], scales, sums[t], x[t]);
            }
        }
    }
    acc
}

/// The combined 32-bit sums `256·hi + lo` over the high and the low
/// activation planes of `T` rows (`hi` alone for 8-bit rows) of one block
/// of each of two groups, from their nibbles `a` and `b`: per group what
/// `combine` makes of the one-group kernel's `block_sums`. The high plane's
/// 16-bit sums are widened and weighted by one `madd` with 256, which
/// leaves the same integers as a shift after the widening, one instruction
/// fewer per row, group and block (and fewer registers spilled): one
/// thread's 16-bit prefill of a 1536 x 576 Q4_1 layer over 128 rows on a
/// Zen 3 ran 1.02-1.46x as fast as with the shift (six rounds, both builds
/// at once, one per core).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn pair_block_sums<const T: usize, const SHIFT: u32>(
    a: &[u8],
    b: &[u8],
    x: BlockPlanes<'_, T, SHIFT>,
) -> [[__m256i; T]; 2] {
    let mut sum_hi = [[_mm256_setzero_si256(); T]; 2];
    let mut sum_lo = [[_mm256_setzero_si256(); T]; 2];
    // A trip count the compiler cannot see keeps it from unrolling the
    // four chunks and unpacking all of them up front (which spills).
    for j in 0..std::hint::black_box(4) {
        let w = [
            split_nibbles(load32(&a[32 * j..]), x.consts.low4),
            split_nibbles(load32(&b[32 * j..]), x.consts.low4),
        ];
        for t in 0..T {
            add_plane(&mut sum_hi, t, w, x.his[t], j);
            if BlockPlanes::<T, SHIFT>::HAS_LO {
                add_plane(&mut sum_lo, t, w, x.los[t], j);
            }
        }
    }
    debug_assert!(SHIFT == WIDE || SHIFT == BYTE);
    let ones = x.consts.ones;
    std::array::from_fn(|g| {
        std::array::from_fn(|t| {
            if BlockPlanes::<T, SHIFT>::HAS_LO {
                let hi = _mm256_madd_epi16(sum_hi[g][t], x.consts.wide_hi);
                _mm256_add_epi32(hi, _mm256_madd_epi16(sum_lo[g][t], ones))
            } else {
                _mm256_madd_epi16(sum_hi[g][t], ones)
            }
        })
    })
}

/// Adds row `t`'s 16-bit products of chunk `j` of both groups' unpacked
/// nibbles `w` with one activation plane `x` to `sums`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn add_plane<const T: usize>(
    sums: &mut [[__m256i; T]; 2],
    t: usize,
    w: [(__m256i, __m256i); 2],
    x: &[i8; 32],
    j: usize,
) {
    // The activation words of the low and the high nibbles' columns.
    let (x_lo, x_hi) = (word(x, 4 * j), word(x, 16 + 4 * j));
    for (sums, (w_lo, w_hi)) in sums.iter_mut().zip(w) {
        let p = _mm256_add_epi16(
            _mm256_maddubs_epi16(w_lo, x_lo),
            _mm256_maddubs_epi16(w_hi, x_hi),
        );
        sums[t] = _mm256_add_epi16(sums[t], p);
    }
}
