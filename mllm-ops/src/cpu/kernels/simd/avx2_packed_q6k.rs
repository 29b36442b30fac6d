//! AVX2 product of a packed Q6_K row group (see `packed_q6k`) with one to
//! four 16-bit activation rows that have one scale per super-block.
//!
//! Per half of a block of 32 columns, the four nibble chunks and two
//! top-bit words rebuild four registers of 6-bit values (four columns of
//! the eight rows each), one half after the other so that the values, the
//! accumulators and the broadcast activations fit AVX2's sixteen
//! registers. `maddubs`
//! with broadcast activation words gives 16-bit pair sums of at most
//! `2 · 63 · 128`, two of which still fit 16 bits before `madd` widens
//! them, so each half's sums of each plane are exact 32-bit integers; times
//! the half's scale they add up over the super-block before its float
//! step (see `packed_q6k` for the formula every level shares).
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use super::avx2_i8::load32;
use super::avx2_packed::{word, BlockPlanes};
use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::packed_q6k::{Q6KInput, NIBBLE_BYTES};
use crate::cpu::kernels::qact::BLOCK;

/// Defines `tile::<T>`, the eight outputs of one packed Q6_K group for `T`
/// activation rows, over a module's half-block sums `$plane_sums` (as
/// [`plane_sums`]); the AVX2, AVX-VNNI and AVX-512 VNNI kernels share it.
macro_rules! q6k_tile {
    ($features:literal, $plane_sums:path) => {
        /// The eight outputs of one packed group for `T` activation rows.
        #[target_feature(enable = $features)]
        #[inline]
        fn tile<const T: usize, const SHIFT: u32>(
            group: &[u8],
            xs: &[Q6KInput<'_, SHIFT>],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) -> [__m256; T] {
            use $crate::cpu::kernels::packed_q6k::{
                RowHalfOffsets, BITS_AT, BLOCKS, BLOCK_BITS, SUPER_BYTES,
            };
            use $crate::cpu::kernels::simd::avx2_packed::{f16x8, ByteConsts, RowPlanes};
            use $crate::cpu::kernels::simd::avx2_packed_q6k::{add_super, half_values, i8x8};
            let xs: [Q6KInput<'_, SHIFT>; T] = std::array::from_fn(|t| xs[t]);
            let nb = xs[0].x.d.len();
            let planes = RowPlanes::new(xs.map(|x| x.x), nb, ByteConsts::new());
            let offsets = RowHalfOffsets::new(&xs, nb);
            let mut acc = [_mm256_setzero_ps(); T];
            let supers = group[..nb / BLOCKS * SUPER_BYTES]
                .as_chunks::<SUPER_BYTES>()
                .0;
            let mut ahead = $crate::cpu::kernels::simd::prefetch::Streams::new(group, 1, reads);
            for (s, sb) in supers.iter().enumerate() {
                let mut sums_hi = [_mm256_setzero_si256(); T];
                let mut sums_lo = [_mm256_setzero_si256(); T];
                for j in 0..BLOCKS {
                    let i = s * BLOCKS + j;
                    let block_bytes = SUPER_BYTES / BLOCKS;
                    ahead.next(block_bytes);
                    let block = planes.block(i);
                    let block_offsets = offsets.block(i);
                    let bits = &sb[BITS_AT + BLOCK_BITS * j..][..BLOCK_BITS];
                    $crate::cpu::kernels::simd::prefetch::block_into_l1(bits, BLOCK_BITS);
                    // One half at a time: its four registers of values, its
                    // scale and the sums stay in registers. Written out
                    // twice by a macro: a closure called twice was left out
                    // of line for 8-bit rows (a third of the speed), and a
                    // loop over the halves kept the accumulators on the
                    // stack.
                    $crate::cpu::kernels::simd::avx2_packed_q6k::q6k_half!(
                        0,
                        $plane_sums,
                        T,
                        (bits, sb, i, block, block_offsets),
                        (sums_hi, sums_lo)
                    );
                    $crate::cpu::kernels::simd::avx2_packed_q6k::q6k_half!(
                        1,
                        $plane_sums,
                        T,
                        (bits, sb, i, block, block_offsets),
                        (sums_hi, sums_lo)
                    );
                }
                let d = f16x8(&sb[..16]);
                for t in 0..T {
                    let sums = (sums_hi[t], sums_lo[t]);
                    acc[t] = add_super::<SHIFT>(acc[t], d, sums, xs[t].x.d[s * BLOCKS]);
                }
            }
            acc
        }
    };
}

pub(crate) use q6k_tile;

/// Half `$h` (0: the first 16 columns, 1: the last 16) of block `$i` in
/// `q6k_tile`: its values from the block's `$bits`, its scale from the
/// super-block `$sb`, and for each of the `$rows` rows the half's sums
/// `Σ (q − 32)·hi` and `Σ (q − 32)·lo` (`$plane_sums` from the row's half
/// offsets in `$offsets`, the block's of every row) times the scale,
/// added to `$hi` and `$lo`.
macro_rules! q6k_half {
    ($h:literal, $plane_sums:path, $rows:ident,
     ($bits:ident, $sb:ident, $i:ident, $block:ident, $offsets:ident),
     ($hi:ident, $lo:ident)) => {{
        use $crate::cpu::kernels::packed_q6k::{BLOCKS, SCALES_AT};
        let w = half_values::<$h>($bits);
        let sc = i8x8(&$sb[SCALES_AT + GROUP_ROWS * (2 * ($i % BLOCKS) + $h)..]);
        for t in 0..$rows {
            let [off_hi, off_lo] = $offsets[t][$h];
            let (sum_hi, sum_lo) = $plane_sums(&w, $block, t, 16 * $h);
            let sum_hi = _mm256_add_epi32(sum_hi, _mm256_set1_epi32(off_hi));
            $hi[t] = _mm256_add_epi32($hi[t], _mm256_mullo_epi32(sum_hi, sc));
            if SHIFT != $crate::cpu::kernels::qact::BYTE {
                let sum_lo = _mm256_add_epi32(sum_lo, _mm256_set1_epi32(off_lo));
                $lo[t] = _mm256_add_epi32($lo[t], _mm256_mullo_epi32(sum_lo, sc));
            }
        }
    }};
}

pub(crate) use q6k_half;

q6k_tile!("avx2,fma,f16c", plane_sums);

/// The 6-bit values of one half (`H` = 0: the first 16 columns, 1: the
/// last 16) of one block's bits: four registers, one per chunk.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn half_values<const H: usize>(bits: &[u8]) -> [__m256i; 4] {
    let low4 = _mm256_set1_epi8(0x0F);
    let top2 = _mm256_set1_epi8(0x30);
    std::array::from_fn(|c| {
        let v = load32(&bits[32 * c..]);
        let top = load32(&bits[NIBBLE_BYTES + 32 * (c / 2)..]);
        let top = if c % 2 == 1 {
            _mm256_srli_epi16::<4>(top)
        } else {
            top
        };
        if H == 0 {
            _mm256_or_si256(
                _mm256_and_si256(v, low4),
                _mm256_and_si256(_mm256_slli_epi16::<4>(top), top2),
            )
        } else {
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4),
                _mm256_and_si256(_mm256_slli_epi16::<2>(top), top2),
            )
        }
    })
}

/// `Σ w·hi` and `Σ w·lo` over 16 columns starting at `base` of row `t`'s
/// activation block, per row lane (`Σ w·lo` zero for `qact::BYTE` rows).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn plane_sums<const T: usize, const SHIFT: u32>(
    w: &[__m256i; 4],
    x: BlockPlanes<'_, T, SHIFT>,
    t: usize,
    base: usize,
) -> (__m256i, __m256i) {
    let ones = _mm256_set1_epi16(1);
    let plane = |x: &[i8; BLOCK]| {
        let pair = |c: usize| {
            _mm256_add_epi16(
                _mm256_maddubs_epi16(w[c], word(x, base + 4 * c)),
                _mm256_maddubs_epi16(w[c + 1], word(x, base + 4 * c + 4)),
            )
        };
        _mm256_add_epi32(
            _mm256_madd_epi16(pair(0), ones),
            _mm256_madd_epi16(pair(2), ones),
        )
    };
    let lo = if BlockPlanes::<T, SHIFT>::HAS_LO {
        plane(x.los[t])
    } else {
        _mm256_setzero_si256()
    };
    (plane(x.his[t]), lo)
}

/// Adds one super-block to the eight rows' outputs `acc`: with the rows'
/// `d`, the integer sums `Σ sc·(q − 32)·hi` and `Σ sc·(q − 32)·lo` (of
/// rows split at `SHIFT`) and the activation scale `dx`,
/// `fma(2^SHIFT·hi + lo, d·dx, acc)`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn add_super<const SHIFT: u32>(
    acc: __m256,
    d: __m256,
    (hi, lo): (__m256i, __m256i),
    dx: f32,
) -> __m256 {
    use super::avx2_packed_q4k::plane_sum;
    _mm256_fmadd_ps(
        plane_sum::<SHIFT>(hi, lo),
        _mm256_mul_ps(d, _mm256_set1_ps(dx)),
        acc,
    )
}

/// The eight signed bytes at the start of `b` as 32-bit integers.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn i8x8(b: &[u8]) -> __m256i {
    let bytes: [u8; 8] = b[..8].try_into().expect("eight bytes");
    _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(bytes)))
}

super::avx2_packed::packed_group_dot!("avx2,fma,f16c", [const SHIFT: u32], Q6KInput<'_, SHIFT>);
