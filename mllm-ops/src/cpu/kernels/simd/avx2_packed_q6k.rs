//! AVX2 product of a packed Q6_K row group (see `packed_q6k`) with one to
//! four 16-bit activation rows.
//!
//! Per half of a block of 32 columns, the four nibble chunks and two
//! top-bit words rebuild four registers of 6-bit values (four columns of
//! the eight rows each), one half after the other so that the values, the
//! accumulators and the broadcast activations fit AVX2's sixteen
//! registers. `maddubs`
//! with broadcast activation words gives 16-bit pair sums of at most
//! `2 · 63 · 128`, two of which still fit 16 bits before `madd` widens
//! them, so each half's sums over both planes are exact 32-bit integers.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use super::avx2_i8::load32;
use super::avx2_packed::{combine, word, BlockPlanes};
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
                BITS_AT, BLOCKS, BLOCK_BITS, SCALES_AT, SUPER_BYTES,
            };
            use $crate::cpu::kernels::simd::avx2_packed::{f16x8, ByteConsts, RowPlanes};
            use $crate::cpu::kernels::simd::avx2_packed_q6k::{add_half, half_values, i8x8};
            let xs: [Q6KInput<'_, SHIFT>; T] = std::array::from_fn(|t| xs[t]);
            let nb = xs[0].x.d.len();
            let planes = RowPlanes::new(xs.map(|x| x.x), nb, ByteConsts::new());
            let mut acc = [_mm256_setzero_ps(); T];
            let supers = group[..nb / BLOCKS * SUPER_BYTES]
                .as_chunks::<SUPER_BYTES>()
                .0;
            let d_supers = xs.map(|x| x.x.d.as_chunks::<BLOCKS>().0);
            let h_supers = xs.map(|x| x.half_offsets.as_chunks::<{ 2 * BLOCKS }>().0);
            let mut ahead = $crate::cpu::kernels::simd::prefetch::Streams::new(group, 1, reads);
            for (s, sb) in supers.iter().enumerate() {
                let (dxs, hss) = (d_supers.map(|d| &d[s]), h_supers.map(|h| &h[s]));
                let d = f16x8(&sb[..16]);
                for j in 0..BLOCKS {
                    let i = s * BLOCKS + j;
                    let block_bytes = SUPER_BYTES / BLOCKS;
                    ahead.next(block_bytes);
                    let block = planes.block(i);
                    let bits = &sb[BITS_AT + BLOCK_BITS * j..][..BLOCK_BITS];
                    if T > 1 {
                        $crate::cpu::kernels::simd::prefetch::block_into_l1(bits, BLOCK_BITS);
                    }
                    // One half at a time: its four registers of values, its
                    // scale and the accumulators stay in registers. Written
                    // out twice by a macro: a closure called twice was left
                    // out of line for 8-bit rows (a third of the speed), and
                    // a loop over the halves kept the accumulators on the
                    // stack.
                    $crate::cpu::kernels::simd::avx2_packed_q6k::q6k_half!(
                        0,
                        $plane_sums,
                        T,
                        (bits, sb, d, j, block, hss, dxs),
                        acc
                    );
                    $crate::cpu::kernels::simd::avx2_packed_q6k::q6k_half!(
                        1,
                        $plane_sums,
                        T,
                        (bits, sb, d, j, block, hss, dxs),
                        acc
                    );
                }
            }
            acc
        }
    };
}

pub(crate) use q6k_tile;

/// Half `$h` (0: the first 16 columns, 1: the last 16) of block `$j` in
/// `q6k_tile`: its values from the block's `$bits`, its scale from the
/// super-block `$sb` (times `$d`), and each of the `$rows` accumulators in
/// `$acc` advanced by its half-block sum (`$plane_sums`).
macro_rules! q6k_half {
    ($h:literal, $plane_sums:path, $rows:ident,
     ($bits:ident, $sb:ident, $d:ident, $j:ident, $block:ident, $hss:ident, $dxs:ident),
     $acc:ident) => {{
        let w = half_values::<$h>($bits);
        let sc = i8x8(&$sb[SCALES_AT + GROUP_ROWS * (2 * $j + $h)..]);
        let scale = _mm256_mul_ps($d, sc);
        for t in 0..$rows {
            let sum = $plane_sums(&w, $block, t, 16 * $h);
            $acc[t] = add_half($acc[t], sum, $hss[t][2 * $j + $h], scale, $dxs[t][$j]);
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

/// `256·Σ w·hi + Σ w·lo` over 16 columns starting at `base` of row `t`'s
/// activation block, per row lane (`Σ w·hi` for `qact::BYTE` rows).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn plane_sums<const T: usize, const SHIFT: u32>(
    w: &[__m256i; 4],
    x: BlockPlanes<'_, T, SHIFT>,
    t: usize,
    base: usize,
) -> __m256i {
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
    combine::<SHIFT>(plane(x.his[t]), lo)
}

/// `fma(Σ w·q_x − 32·Σ q_x, scale·dx, acc)`: one half block's
/// contribution to the eight rows (`offset` is `−32·Σ q_x`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn add_half(acc: __m256, sum: __m256i, offset: i32, scale: __m256, dx: f32) -> __m256 {
    let p = _mm256_add_epi32(sum, _mm256_set1_epi32(offset));
    let scale = _mm256_mul_ps(scale, _mm256_set1_ps(dx));
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc)
}

/// The eight signed bytes at the start of `b` as f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn i8x8(b: &[u8]) -> __m256 {
    let bytes: [u8; 8] = b[..8].try_into().expect("eight bytes");
    let v = _mm_cvtsi64_si128(i64::from_le_bytes(bytes));
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
}

super::avx2_packed::packed_group_dot!("avx2,fma,f16c", [const SHIFT: u32], Q6KInput<'_, SHIFT>);
