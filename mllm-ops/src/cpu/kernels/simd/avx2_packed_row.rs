//! AVX2 products of one activation row with a run of consecutive packed
//! groups (see `packed`, `packed_q5`, `packed_q8`): decode's calls, group
//! after group in one loop, for packed Q4, Q5 and Q8_0.
//!
//! The one-group kernels (`group_dot` of `avx2_packed`, `avx2_packed_q5`,
//! `avx2_packed_q8`) give the same outputs one group per call,
//! but for one row each call's fixed work (its tile's set-up, the prefetch
//! cursor's division, the checks of every slice) weighs on groups of a few
//! dozen blocks: SmolLM2's rows are 18 blocks wide. Here the activation
//! row's blocks are set up once for the run, the block loop walks them
//! with the weights without an index check, and one prefetch stream runs
//! through all the run's groups. The integers and the float steps are the
//! one-group kernels', so the outputs have their bits, as batch invariance
//! needs (a decode row alone here, the same row in a batch through the
//! tiles).
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use super::avx2_packed::{BlockPlanes, ByteConsts};
use super::avx2_packed_q8::{add_sums, mixed_rows, quad, scales, widen16};
use super::prefetch::{block_into_l1, Streams};
use crate::cpu::kernels::packed::{WeightReads, GROUP_ROWS, PACKED_BLOCK_BYTES};
use crate::cpu::kernels::packed_q8::{Q8Input, Q8_PACKED_BLOCK_BYTES};
use crate::cpu::kernels::qact::{BLOCK, BYTE};

/// Defines `$name::<SHIFT>`, the eight outputs of each group in `groups`
/// (consecutive groups of `x`'s width: `out[g]` for group `g`) for the
/// activation row `x` (16-bit, or 8-bit `BYTE` rows), for a packed layout
/// of `$block_bytes` per block that starts with the eight rows' f16
/// scales and offsets (as `avx2_packed::scaled_block_tile!` takes it):
/// the calling module's `$sums::<SHIFT>(bits, hi, lo, consts)` gives a
/// block's combined sums `256·hi + lo` (`hi` for 8-bit rows) as that
/// tile's block sums and `combine` do, and the float steps are the tile's.
macro_rules! scaled_row_run {
    ($name:ident, $block_bytes:expr, $sums:ident) => {
        /// The row run (see `avx2_packed_row::scaled_row_run!`).
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) fn $name<const SHIFT: u32>(
            groups: &[u8],
            x: $crate::cpu::kernels::qact::Q16Row<'_, SHIFT>,
            out: &mut [[f32; $crate::cpu::kernels::packed::GROUP_ROWS]],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) {
            use $crate::cpu::kernels::packed::NIBBLES_AT;
            use $crate::cpu::kernels::qact::{BLOCK, BYTE, WIDE};
            use $crate::cpu::kernels::simd::avx2_packed::{
                add_block_sum, block_scales, ByteConsts,
            };
            use $crate::cpu::kernels::simd::prefetch::{block_into_l1, Streams};
            debug_assert!(SHIFT == WIDE || SHIFT == BYTE);
            let nb = x.d.len();
            let group_bytes = nb * $block_bytes;
            if group_bytes == 0 {
                out.fill([0.0; $crate::cpu::kernels::packed::GROUP_ROWS]);
                return;
            }
            let his = &x.hi.as_chunks::<BLOCK>().0[..nb];
            // 8-bit rows have no low plane to read: their high plane
            // stands in.
            let los = if SHIFT == BYTE {
                his
            } else {
                &x.lo.as_chunks::<BLOCK>().0[..nb]
            };
            let (d, s) = (&x.d[..nb], &x.s[..nb]);
            let consts = ByteConsts::new();
            let mut ahead = Streams::new(groups, 1, reads);
            for (group, out) in groups.chunks_exact(group_bytes).zip(out) {
                let blocks = group.as_chunks::<{ $block_bytes }>().0;
                let mut acc = _mm256_setzero_ps();
                let row = his.iter().zip(los).zip(d.iter().zip(s));
                for (blk, ((hi, lo), (&dx, &sx))) in blocks.iter().zip(row) {
                    ahead.next($block_bytes);
                    block_into_l1(blk, $block_bytes);
                    let sums = $sums::<SHIFT>(&blk[NIBBLES_AT..], hi, lo, consts);
                    acc = add_block_sum(acc, block_scales(blk), sums, (dx, sx));
                }
                $crate::cpu::kernels::simd::avx2::store(out, acc);
            }
        }
    };
}

pub(crate) use scaled_row_run;

scaled_row_run!(q4_row_run, PACKED_BLOCK_BYTES, block_sums);

super::avx2_packed::nibble_block_sums!(sixteen);

/// The eight rows' combined 32-bit sums `256·hi + lo` of one packed Q4
/// block (`hi` alone for [`BYTE`] rows) from its 128 bytes of nibbles and
/// the row's block of each plane: the one-group kernel's 16-bit pair sums
/// (`block_sums16`), the high plane's widened and weighted by one `madd`
/// with 256 (as the two-group kernel does), a shift fewer per block than
/// `combine`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn block_sums<const SHIFT: u32>(
    nibbles: &[u8],
    hi: &[i8; BLOCK],
    lo: &[i8; BLOCK],
    consts: ByteConsts,
) -> __m256i {
    let planes = BlockPlanes::<1, SHIFT> {
        his: [hi],
        los: [lo],
        consts,
    };
    let ([sum_hi], [sum_lo]) = block_sums16(nibbles, planes);
    if SHIFT == BYTE {
        _mm256_madd_epi16(sum_hi, consts.ones)
    } else {
        let hi = _mm256_madd_epi16(sum_hi, consts.wide_hi);
        _mm256_add_epi32(hi, _mm256_madd_epi16(sum_lo, consts.ones))
    }
}

/// The eight outputs of each packed Q8_0 group in `groups` (consecutive
/// groups of `x`'s width: `out[g]` for group `g`) for the activation row
/// `x`, from its 16-bit values as `avx2_packed_q8` takes them.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q8_row_run<const SHIFT: u32>(
    groups: &[u8],
    x: Q8Input<'_, SHIFT>,
    out: &mut [[f32; GROUP_ROWS]],
    reads: WeightReads,
) {
    let nb = x.x.d.len();
    let group_bytes = nb * Q8_PACKED_BLOCK_BYTES;
    if group_bytes == 0 {
        out.fill([0.0; GROUP_ROWS]);
        return;
    }
    let values = &x.values.as_chunks::<BLOCK>().0[..nb];
    let ds = &x.x.d[..nb];
    let mixed = mixed_rows();
    let mut ahead = Streams::new(groups, 1, reads);
    for (group, out) in groups.chunks_exact(group_bytes).zip(out) {
        let blocks = group.as_chunks::<Q8_PACKED_BLOCK_BYTES>().0;
        let mut acc = _mm256_setzero_ps();
        for (blk, (values, &dx)) in blocks.iter().zip(values.iter().zip(ds)) {
            ahead.next(Q8_PACKED_BLOCK_BYTES);
            block_into_l1(blk, Q8_PACKED_BLOCK_BYTES);
            let mut rows03 = _mm256_setzero_si256();
            let mut rows47 = _mm256_setzero_si256();
            for (j, chunk) in blk[16..].as_chunks::<32>().0.iter().enumerate() {
                let (w03, w47) = (widen16(&chunk[..16]), widen16(&chunk[16..]));
                let q = quad(&values[4 * j..]);
                rows03 = _mm256_add_epi32(rows03, _mm256_madd_epi16(w03, q));
                rows47 = _mm256_add_epi32(rows47, _mm256_madd_epi16(w47, q));
            }
            let d = _mm256_permutevar8x32_ps(scales(blk), mixed);
            acc = add_sums(acc, d, _mm256_hadd_epi32(rows03, rows47), dx);
        }
        store(out, _mm256_permutevar8x32_ps(acc, mixed));
    }
}
