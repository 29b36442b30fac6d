//! AVX-512 VNNI product of a packed Q4_K row group (see `packed_q4k`) with
//! one to four 16-bit activation rows, on 256-bit vectors (AVX-512VL), and
//! of two consecutive groups at once on 512-bit vectors (`pair_dot`, up to
//! four 16-bit rows or eight 8-bit ones, see `PackedFormat::PAIR_TILE_TOKENS`).
//!
//! The block sums are those of `vnni_packed` (`dpbusd`), the same integers
//! as AVX2's, and the integer and float steps after them are
//! `avx2_packed_q4k`'s in the same order, so the results equal the AVX2
//! kernel's bit for bit. The pair kernel takes each sub-block's sums in
//! two parts of 16 columns, which fit `i16`, and their products with the
//! sub-block's scales in one `vpdpwssd` each ([`pair_scaled_sums`]): the
//! same integers, where a `vpmulld` and an add per sum were three
//! instructions.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA, F16C, AVX-512F, AVX-512VL,
//! AVX-512BW and AVX-512 VNNI (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use super::vnni_packed::store_pair;
use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::qact::{Q16Row, BYTE};

super::vnni_packed::nibble_block_sums!();

super::avx2_packed_q4k::q4k_tile!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    block_sums,
    crate::cpu::kernels::packed_q4k::Nibbles
);

super::avx2_packed::packed_group_dot!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    [const SHIFT: u32],
    Q16Row<'_, SHIFT>
);

/// The eight bytes at the start of `a` and those at the start of `b` as
/// sixteen 32-bit integers.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn u8x16(a: &[u8], b: &[u8]) -> __m512i {
    let word = |s: &[u8]| i64::from_le_bytes(s[..8].try_into().expect("eight bytes"));
    _mm512_cvtepu8_epi32(_mm_set_epi64x(word(b), word(a)))
}

/// `avx2_packed_q4k::add_super` for sixteen rows (two groups) at once.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn pair_add_super<const SHIFT: u32>(
    acc: __m512,
    (d, neg_dmin): (__m512, __m512),
    (hi, lo, mins): (__m512i, __m512i, __m512i),
    dx: f32,
) -> __m512 {
    let dx = _mm512_set1_ps(dx);
    let acc = _mm512_fmadd_ps(pair_plane_sum::<SHIFT>(hi, lo), _mm512_mul_ps(d, dx), acc);
    _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(neg_dmin, dx), acc)
}

/// `avx2_packed_q4k::plane_sum` for sixteen rows (two groups) at once.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn pair_plane_sum<const SHIFT: u32>(hi: __m512i, lo: __m512i) -> __m512 {
    let hi = _mm512_cvtepi32_ps(hi);
    if SHIFT == BYTE {
        hi
    } else {
        let step = _mm512_set1_ps((1u32 << SHIFT) as f32);
        _mm512_fmadd_ps(hi, step, _mm512_cvtepi32_ps(lo))
    }
}

/// `−dmin` of two groups' super-blocks `sa` and `sb` (from their headers'
/// f16 values), as sixteen f32.
#[target_feature(enable = "avx512f,avx512vl")]
#[inline]
pub(crate) fn pair_neg_dmin(sa: &[u8], sb: &[u8]) -> __m512 {
    use super::vnni_packed::f16x16;
    _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(f16x16(&sa[16..32], &sb[16..32])),
        _mm512_set1_epi32(i32::MIN),
    ))
}

/// Defines `pair_tile::<T>`, the outputs of two consecutive packed groups
/// `a` and `b` for `T` activation rows at once on 512-bit vectors (lanes
/// 0..8 of each result are `a`'s eight rows, lanes 8..16 `b`'s), for a
/// K-quant layout with packed Q4_K's header and the sub-block bits
/// `$bits` (as for `q4k_tile`), where `$scaled_sums(a, b, planes, sc,
/// sums_hi, sums_lo)` adds each row's block sums of a sub-block of the
/// two groups, times the sub-block's scales `sc` (one per lane), to the
/// row's `sums_hi` and `sums_lo` (as [`pair_scaled_sums`] here, or
/// `vnni_packed_q5k`'s). Lane by lane the integer and float steps of
/// `q4k_tile`, so the same bits; the packed Q4_K and Q5_K kernels share
/// it.
macro_rules! q4k_pair_tile {
    ($bits:ty, $scaled_sums:path) => {
        /// The outputs of groups `a` and `b` for `T` activation rows.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        #[inline]
        fn pair_tile<const T: usize, const SHIFT: u32>(
            a: &[u8],
            b: &[u8],
            xs: &[Q16Row<'_, SHIFT>],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) -> [__m512; T] {
            use $crate::cpu::kernels::packed_q4k::{
                SubBlockBits, BITS_AT, MINS_AT, SCALES_AT, SUB_BLOCKS,
            };
            use $crate::cpu::kernels::simd::avx2_packed::{ByteConsts, RowPlanes};
            use $crate::cpu::kernels::simd::kquant_mins::{min_sum_words, row_mins, MinWeights};
            use $crate::cpu::kernels::simd::prefetch::block_into_l1;
            use $crate::cpu::kernels::simd::vnni_packed::f16x16;
            use $crate::cpu::kernels::simd::vnni_packed_q4k::{
                pair_add_super, pair_neg_dmin, u8x16,
            };
            const BLOCK_BITS: usize = <$bits as SubBlockBits>::BLOCK_BITS;
            const SUPER_BYTES: usize = <$bits as SubBlockBits>::SUPER_BYTES;
            let xs: [Q16Row<'_, SHIFT>; T] = std::array::from_fn(|t| xs[t]);
            let nb = xs[0].d.len();
            let planes = RowPlanes::new(xs, nb, ByteConsts::new());
            let mut acc = [_mm512_setzero_ps(); T];
            let len = nb / SUB_BLOCKS * SUPER_BYTES;
            let supers_a = a[..len].as_chunks::<SUPER_BYTES>().0;
            let supers_b = b[..len].as_chunks::<SUPER_BYTES>().0;
            let mut ahead = {
                use $crate::cpu::kernels::simd::prefetch::{Streams, K_QUANT_PAIR_AHEAD};
                Streams::with_ahead(a, 2, reads, K_QUANT_PAIR_AHEAD)
            };
            for (s, (sa, sb)) in supers_a.iter().zip(supers_b).enumerate() {
                let mut sums_hi = [_mm512_setzero_si512(); T];
                let mut sums_lo = [_mm512_setzero_si512(); T];
                for j in 0..SUB_BLOCKS {
                    let i = s * SUB_BLOCKS + j;
                    let block_bytes = SUPER_BYTES / SUB_BLOCKS;
                    ahead.next(block_bytes);
                    let at = BITS_AT + BLOCK_BITS * j;
                    block_into_l1(&sa[at..], BLOCK_BITS);
                    block_into_l1(&sb[at..], BLOCK_BITS);
                    let sc_at = SCALES_AT + GROUP_ROWS * j;
                    let sc = u8x16(&sa[sc_at..], &sb[sc_at..]);
                    let (bits_a, bits_b) = (&sa[at..], &sb[at..]);
                    let sums = (&mut sums_hi, &mut sums_lo);
                    $scaled_sums(bits_a, bits_b, planes.block(i), sc, sums);
                }
                let d = f16x16(&sa[..16], &sb[..16]);
                let neg_dmin = pair_neg_dmin(sa, sb);
                let first = s * SUB_BLOCKS;
                let mins = MinWeights::new::<SHIFT>(sa, sb, MINS_AT);
                for t in 0..T {
                    let mins = row_mins::<SHIFT>(&mins, &min_sum_words(&xs[t], s));
                    let sums = (sums_hi[t], sums_lo[t], mins);
                    acc[t] = pair_add_super::<SHIFT>(acc[t], (d, neg_dmin), sums, xs[t].d[first]);
                }
            }
            acc
        }
    };
}

pub(crate) use q4k_pair_tile;

/// `sum + sc·part` lane by lane, exact, for a `part` in `i16`'s range and
/// a `sc` below 2^15 (a zero-extended 6-bit scale): one `vpdpwssd`, whose
/// products of the lanes' high 16 bits are `part`'s sign times `sc`'s
/// zero high half. Where a `vpmulld` and an add took three instructions.
///
/// `written_out` puts the instruction in as it is. Through the intrinsic,
/// the compiler splits one of each row's two into `vpmaddwd` and `vpaddd`
/// (a shorter chain through the row's sums, which do not set the pace
/// here): one instruction more per row, plane and sub-block. With the
/// second written out it splits neither; 16-bit rows leave the first to
/// the intrinsic (both written out ran no faster, 0.96-1.00).
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
fn add_scaled(sum: __m512i, part: __m512i, sc: __m512i, written_out: bool) -> __m512i {
    if !written_out {
        return _mm512_dpwssd_epi32(sum, part, sc);
    }
    let mut sum = sum;
    // SAFETY: the instruction reads and writes registers only; the
    // enclosing function requires AVX-512F and AVX-512 VNNI, which
    // `vpdpwssd` on 512-bit registers needs.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {sum}, {part}, {sc}",
            sum = inout(zmm_reg) sum,
            part = in(zmm_reg) part,
            sc = in(zmm_reg) sc,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    sum
}

/// The packed Q4_K `$scaled_sums` of `q4k_pair_tile`: the sums of two
/// groups' sub-block (`a`'s bits in the low halves, `b`'s in the high
/// ones) in two parts of 16 columns each, whose sums fit `i16`
/// (`|Σ q·x| ≤ 16·15·128`, for `q` in `0..16` and either plane of a
/// 16-bit row or an 8-bit row), so that [`add_scaled`] takes each part's
/// scaled sum in one `vpdpwssd`. The same integers as `vnni_packed`'s
/// block sums times the scales.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn pair_scaled_sums<const T: usize, const SHIFT: u32>(
    a: &[u8],
    b: &[u8],
    x: super::avx2_packed::BlockPlanes<'_, T, SHIFT>,
    sc: __m512i,
    (sums_hi, sums_lo): (&mut [__m512i; T], &mut [__m512i; T]),
) {
    use super::avx2_i8::load32;
    use super::avx2_packed::BlockPlanes;
    use super::vnni_packed::{dpbusd_words, join};
    use crate::cpu::kernels::qact::BLOCK;
    let nibble = _mm512_set1_epi8(0x0F);
    let v: [__m512i; 4] = std::array::from_fn(|j| join(load32(&a[32 * j..]), load32(&b[32 * j..])));
    let w_lo = v.map(|v| _mm512_and_si512(v, nibble));
    if T > 1 {
        // Chunk `c` holds columns `4c..4c + 4` in its low nibbles and
        // `16 + 4c..` in its high ones: a row's products with the low
        // nibbles of all four are one part, with the high ones the other.
        let w_hi = v.map(|v| _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble));
        let scaled_plane = |sum: __m512i, x: &[i8; BLOCK]| {
            let zero = _mm512_setzero_si512();
            let low = dpbusd_words::<T, 0>(zero, w_lo, x, false);
            let high = dpbusd_words::<T, 16>(zero, w_hi, x, false);
            let sum = add_scaled(sum, low, sc, SHIFT == BYTE);
            add_scaled(sum, high, sc, true)
        };
        // Row by row, written out: as a loop, eight rows' products were
        // left rolled with the rows' sums in memory (0.83x). The list
        // below names every row of the widest tile.
        const { assert!(T <= 8, "more rows than `rows!` names") };
        macro_rules! rows {
            ($($t:literal)*) => {$(
                if $t < T {
                    sums_hi[$t] = scaled_plane(sums_hi[$t], x.his[$t]);
                    if BlockPlanes::<T, SHIFT>::HAS_LO {
                        sums_lo[$t] = scaled_plane(sums_lo[$t], x.los[$t]);
                    }
                }
            )*};
        }
        rows!(0 1 2 3 4 5 6 7);
        return;
    }
    // One row (decode): the high nibbles kept in place, 16 times their
    // values (one shift per plane), and the products written out as in
    // `vnni_packed`.
    let w_hi16 = v.map(|v| _mm512_andnot_si512(nibble, v));
    let plane = |sum: __m512i, x: &[i8; BLOCK]| {
        let zero = _mm512_setzero_si512();
        let low = dpbusd_words::<T, 0>(zero, w_lo, x, true);
        let high16 = dpbusd_words::<T, 16>(zero, w_hi16, x, true);
        let high = _mm512_srai_epi32::<4>(high16);
        add_scaled(add_scaled(sum, low, sc, false), high, sc, false)
    };
    sums_hi[0] = plane(sums_hi[0], x.his[0]);
    if BlockPlanes::<T, SHIFT>::HAS_LO {
        sums_lo[0] = plane(sums_lo[0], x.los[0]);
    }
}

q4k_pair_tile!(crate::cpu::kernels::packed_q4k::Nibbles, pair_scaled_sums);

super::vnni_packed::packed_pair_dot!([const SHIFT: u32], Q16Row<'_, SHIFT>, wide);
