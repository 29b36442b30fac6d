//! AVX-512 VNNI product of a packed Q4_K row group (see `packed_q4k`) with
//! one to four 16-bit activation rows, on 256-bit vectors (AVX-512VL), and
//! of two consecutive groups at once on 512-bit vectors (`pair_dot`).
//!
//! The block sums are those of `vnni_packed` (`dpbusd`), the same integers
//! as AVX2's, and the integer and float steps after them are
//! `avx2_packed_q4k`'s in the same order, so the results equal the AVX2
//! kernel's bit for bit.
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
/// `$bits` (as for `q4k_tile`) and the block sums `$pair_sums` of two groups' sub-block
/// bits (as `vnni_packed::pair_block_sums`). Lane by lane the integer and
/// float steps of `q4k_tile`, so the same bits; the packed Q4_K and Q5_K
/// kernels share it.
macro_rules! q4k_pair_tile {
    ($bits:ty, $pair_sums:path) => {
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
                    let (sum_hi, sum_lo) = $pair_sums(&sa[at..], &sb[at..], planes.block(i));
                    let sc_at = SCALES_AT + GROUP_ROWS * j;
                    let sc = u8x16(&sa[sc_at..], &sb[sc_at..]);
                    for t in 0..T {
                        let scaled = _mm512_mullo_epi32(sum_hi[t], sc);
                        sums_hi[t] = _mm512_add_epi32(sums_hi[t], scaled);
                        if SHIFT != $crate::cpu::kernels::qact::BYTE {
                            let scaled = _mm512_mullo_epi32(sum_lo[t], sc);
                            sums_lo[t] = _mm512_add_epi32(sums_lo[t], scaled);
                        }
                    }
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

super::vnni_packed::nibble_pair_block_sums!();

q4k_pair_tile!(crate::cpu::kernels::packed_q4k::Nibbles, pair_block_sums);

super::vnni_packed::packed_pair_dot!([const SHIFT: u32], Q16Row<'_, SHIFT>);
