//! AVX-512 VNNI product of a packed Q6_K row group (see `packed_q6k`) with
//! one to four 16-bit activation rows, on 256-bit vectors (AVX-512VL), and
//! of two consecutive groups at once on 512-bit vectors (`pair_dot`, up to
//! four 16-bit rows or eight 8-bit ones, see `PackedFormat::PAIR_TILE_TOKENS`).
//!
//! The 6-bit values are rebuilt as in `avx2_packed_q6k`; `dpbusd` (unsigned
//! values times signed activation bytes, summed into 32-bit lanes) gives
//! the same integer half sums, and the integer and float steps after them
//! are the same operations in the same order, so the results equal the
//! AVX2 kernel's (and the portable one's) bit for bit.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA, F16C, AVX-512F, AVX-512VL,
//! AVX-512BW and AVX-512 VNNI (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use super::avx2_i8::load32;
use super::avx2_packed::{BlockPlanes, ByteConsts, RowPlanes};
use super::vnni_packed::{dpbusd_word, f16x16, join, store_pair};
use crate::cpu::kernels::packed::{WeightReads, GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::packed_q6k::{
    Q6KInput, RowHalfOffsets, BITS_AT, BLOCKS, BLOCK_BITS, NIBBLE_BYTES, SCALES_AT, SUPER_BYTES,
};

/// The `vpternlog` truth table of `a | (b & c)`.
const A_OR_B_AND_C: i32 = 0xF8;

/// Defines `plane_sums`, `avx2_packed_q6k::plane_sums` with `dpbusd`:
/// `Σ w·hi` and `Σ w·lo` over 16 columns starting at `base`, the same
/// 32-bit sums, with the target features `$features` and the 256-bit
/// `dpbusd` intrinsic `$dpbusd` (AVX-512VL's here, AVX-VNNI's in
/// `avx_vnni_packed`).
macro_rules! q6k_plane_sums {
    ($features:literal, $dpbusd:path) => {
        /// `Σ w·hi` and `Σ w·lo` (zero for 8-bit rows) over 16 columns from
        /// `base`.
        #[target_feature(enable = $features)]
        #[inline]
        fn plane_sums<const T: usize, const SHIFT: u32>(
            w: &[__m256i; 4],
            x: $crate::cpu::kernels::simd::avx2_packed::BlockPlanes<'_, T, SHIFT>,
            t: usize,
            base: usize,
        ) -> (__m256i, __m256i) {
            use $crate::cpu::kernels::qact::BLOCK;
            use $crate::cpu::kernels::simd::avx2_packed::{word, BlockPlanes};
            let plane = |x: &[i8; BLOCK]| {
                w.iter()
                    .enumerate()
                    .fold(_mm256_setzero_si256(), |sum, (c, &w)| {
                        $dpbusd(sum, w, word(x, base + 4 * c))
                    })
            };
            let lo = if BlockPlanes::<T, SHIFT>::HAS_LO {
                plane(x.los[t])
            } else {
                _mm256_setzero_si256()
            };
            (plane(x.his[t]), lo)
        }
    };
}

pub(crate) use q6k_plane_sums;

q6k_plane_sums!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    _mm256_dpbusd_epi32
);

super::avx2_packed_q6k::q6k_tile!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    plane_sums
);

super::avx2_packed::packed_group_dot!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    [const SHIFT: u32], Q6KInput<'_, SHIFT>
);

/// The eight signed bytes at the start of `a` and those at the start of
/// `b` as sixteen 32-bit integers.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn i8x16(a: &[u8], b: &[u8]) -> __m512i {
    let word = |s: &[u8]| i64::from_le_bytes(s[..8].try_into().expect("eight bytes"));
    _mm512_cvtepi8_epi32(_mm_set_epi64x(word(b), word(a)))
}

/// The 6-bit values of one block of two consecutive groups (`ba`'s bits
/// in the low halves, `bb`'s in the high ones): per half (the first and
/// the last 16 columns) and chunk `c`, four columns (`4c..4c + 4` of the
/// half) of the 16 rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn pair_block_values(ba: &[u8], bb: &[u8]) -> [[__m512i; 4]; 2] {
    let (low4, top2) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    let mut w = [[_mm512_setzero_si512(); 4]; 2];
    for c in 0..4 {
        let v = join(load32(&ba[32 * c..]), load32(&bb[32 * c..]));
        let t_at = NIBBLE_BYTES + 32 * (c / 2);
        let top = join(load32(&ba[t_at..]), load32(&bb[t_at..]));
        let top = if c % 2 == 1 {
            _mm512_srli_epi16::<4>(top)
        } else {
            top
        };
        w[0][c] = _mm512_ternarylogic_epi32::<A_OR_B_AND_C>(
            _mm512_and_si512(v, low4),
            _mm512_slli_epi16::<4>(top),
            top2,
        );
        w[1][c] = _mm512_ternarylogic_epi32::<A_OR_B_AND_C>(
            _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4),
            _mm512_slli_epi16::<2>(top),
            top2,
        );
    }
    w
}

/// `avx2_packed_q6k::add_super` for sixteen rows (two groups) at once.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn pair_add_super<const SHIFT: u32>(
    acc: __m512,
    d: __m512,
    (hi, lo): (__m512i, __m512i),
    dx: f32,
) -> __m512 {
    use super::vnni_packed_q4k::pair_plane_sum;
    _mm512_fmadd_ps(
        pair_plane_sum::<SHIFT>(hi, lo),
        _mm512_mul_ps(d, _mm512_set1_ps(dx)),
        acc,
    )
}

/// The outputs of two consecutive packed groups `a` and `b` for `T`
/// activation rows at once, on 512-bit vectors: lanes 0..8 of each result
/// are `a`'s eight rows, lanes 8..16 `b`'s. Lane by lane the same integer
/// and float steps as `tile`, so the same bits.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn pair_tile<const T: usize, const SHIFT: u32>(
    a: &[u8],
    b: &[u8],
    xs: &[Q6KInput<'_, SHIFT>],
    reads: WeightReads,
) -> [__m512; T] {
    let xs: [Q6KInput<'_, SHIFT>; T] = std::array::from_fn(|t| xs[t]);
    let nb = xs[0].x.d.len();
    let planes = RowPlanes::new(xs.map(|x| x.x), nb, ByteConsts::new());
    let offsets = RowHalfOffsets::new(&xs, nb);
    let mut acc = [_mm512_setzero_ps(); T];
    let len = nb / BLOCKS * SUPER_BYTES;
    let supers_a = a[..len].as_chunks::<SUPER_BYTES>().0;
    let supers_b = b[..len].as_chunks::<SUPER_BYTES>().0;
    let mut ahead = {
        use super::prefetch::{Streams, K_QUANT_PAIR_AHEAD};
        Streams::with_ahead(a, 2, reads, K_QUANT_PAIR_AHEAD)
    };
    for (s, (sa, sb)) in supers_a.iter().zip(supers_b).enumerate() {
        let mut sums_hi = [_mm512_setzero_si512(); T];
        let mut sums_lo = [_mm512_setzero_si512(); T];
        for j in 0..BLOCKS {
            let i = s * BLOCKS + j;
            let block = planes.block(i);
            let block_offsets = offsets.block(i);
            let block_bytes = SUPER_BYTES / BLOCKS;
            ahead.next(block_bytes);
            let at = BITS_AT + BLOCK_BITS * j;
            let (ba, bb) = (&sa[at..at + BLOCK_BITS], &sb[at..at + BLOCK_BITS]);
            super::prefetch::block_into_l1(ba, BLOCK_BITS);
            super::prefetch::block_into_l1(bb, BLOCK_BITS);
            let w = pair_block_values(ba, bb);
            let scale = |h: usize| {
                let at = SCALES_AT + GROUP_ROWS * h;
                i8x16(&sa[at..], &sb[at..])
            };
            let scales = [scale(2 * j), scale(2 * j + 1)];
            const { assert!(T <= 8, "more rows than `per_row!` names") };
            super::per_row!(
                T,
                |t| {
                    let (h, l) = (block.his[t], block.los[t]);
                    for (half, (w, sc)) in w.iter().zip(scales).enumerate() {
                        // Each half's sums start at its offsets `−32·Σ hi` and
                        // `−32·Σ lo`, which turn `Σ q·x` into `Σ (q − 32)·x`.
                        let [off_hi, off_lo] = block_offsets[t][half];
                        let mut sum_hi = _mm512_set1_epi32(off_hi);
                        let mut sum_lo = _mm512_set1_epi32(off_lo);
                        for (c, &w) in w.iter().enumerate() {
                            let at = 16 * half + 4 * c;
                            sum_hi = dpbusd_word::<T>(sum_hi, w, h, at);
                            if BlockPlanes::<T, SHIFT>::HAS_LO {
                                sum_lo = dpbusd_word::<T>(sum_lo, w, l, at);
                            }
                        }
                        sums_hi[t] = _mm512_add_epi32(sums_hi[t], _mm512_mullo_epi32(sum_hi, sc));
                        if BlockPlanes::<T, SHIFT>::HAS_LO {
                            sums_lo[t] =
                                _mm512_add_epi32(sums_lo[t], _mm512_mullo_epi32(sum_lo, sc));
                        }
                    }
                },
                [0, 1, 2, 3, 4, 5, 6, 7]
            );
        }
        let d = f16x16(&sa[..16], &sb[..16]);
        for t in 0..T {
            let sums = (sums_hi[t], sums_lo[t]);
            acc[t] = pair_add_super::<SHIFT>(acc[t], d, sums, xs[t].x.d[s * BLOCKS]);
        }
    }
    acc
}

super::vnni_packed::packed_pair_dot!([const SHIFT: u32], Q6KInput<'_, SHIFT>, wide);
