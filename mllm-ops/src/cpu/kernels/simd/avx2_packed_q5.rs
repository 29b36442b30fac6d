//! AVX2 product of a packed Q5 row group (see `packed_q5`) with one to four
//! 16-bit activation rows: the packed Q4 kernel (`avx2_packed`) with each
//! nibble register completed by its fifth bits. `maddubs` pair sums reach
//! `2 · 31 · 128`, so two chunks' sums still fit 16 bits before `madd`
//! widens them, and the 32-bit block sums are exact.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use super::avx2_i8::load32;
use super::avx2_packed::ByteConsts;
use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::packed_q5::{Q5_PACKED_BLOCK_BYTES, TOP_IN_BITS};
use crate::cpu::kernels::qact::{Q16Row, BLOCK};

/// The four chunks' five-bit values of a packed block from its bits (the
/// nibbles, then the fifth bits): `[low, high]` halves (columns
/// `4c..4c + 4` and `16 + 4c..16 + 4c + 4`) of chunk `c`, with the
/// tile's masks `consts`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn values(bits: &[u8], consts: ByteConsts) -> [[__m256i; 2]; 4] {
    let ByteConsts { low4, bit4, .. } = consts;
    let mut top = load32(&bits[TOP_IN_BITS..]);
    std::array::from_fn(|c| {
        let v = load32(&bits[32 * c..]);
        let w = [
            _mm256_or_si256(
                _mm256_and_si256(v, low4),
                _mm256_and_si256(_mm256_slli_epi16::<4>(top), bit4),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4),
                _mm256_and_si256(_mm256_slli_epi16::<3>(top), bit4),
            ),
        ];
        top = _mm256_srli_epi16::<2>(top);
        w
    })
}

/// The eight rows' 32-bit sums of one packed block (from its bits) over
/// the high and the low activation planes of `T` rows.
///
/// `five_bit_block_sums!()` defines it in the calling module: each packed
/// format's kernels get their own copy, so that each instance has one
/// caller, its tile, and is inlined into it.
macro_rules! five_bit_block_sums {
    () => {
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        fn block_sums<const T: usize, const SHIFT: u32>(
            bits: &[u8],
            x: $crate::cpu::kernels::simd::avx2_packed::BlockPlanes<'_, T, SHIFT>,
        ) -> ([__m256i; T], [__m256i; T]) {
            use $crate::cpu::kernels::qact::BLOCK;
            use $crate::cpu::kernels::simd::avx2_packed::{word, BlockPlanes};
            use $crate::cpu::kernels::simd::avx2_packed_q5::values;
            let ones = x.consts.ones;
            let w = values(bits, x.consts);
            let mut sum_hi = [_mm256_setzero_si256(); T];
            let mut sum_lo = [_mm256_setzero_si256(); T];
            $crate::cpu::kernels::simd::per_row!(T, |t| {
                let plane = |x: &[i8; BLOCK], c: usize| {
                    _mm256_add_epi16(
                        _mm256_maddubs_epi16(w[c][0], word(x, 4 * c)),
                        _mm256_maddubs_epi16(w[c][1], word(x, 16 + 4 * c)),
                    )
                };
                let pairs = |x: &[i8; BLOCK], sum: __m256i| {
                    [0, 2].into_iter().fold(sum, |sum, c| {
                        let p = _mm256_add_epi16(plane(x, c), plane(x, c + 1));
                        _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones))
                    })
                };
                sum_hi[t] = pairs(x.his[t], sum_hi[t]);
                if BlockPlanes::<T, SHIFT>::HAS_LO {
                    sum_lo[t] = pairs(x.los[t], sum_lo[t]);
                }
            });
            (sum_hi, sum_lo)
        }
    };
}

pub(crate) use five_bit_block_sums;

five_bit_block_sums!();

super::avx2_packed::scaled_block_tile!("avx2,fma,f16c", Q5_PACKED_BLOCK_BYTES, block_sums);

super::avx2_packed_row::scaled_row_run!(row_run, Q5_PACKED_BLOCK_BYTES, row_block_sums);

/// One row's combined block sums (`256·hi + lo`, `hi` for 8-bit rows) of
/// a packed Q5 block, for [`row_run`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn row_block_sums<const SHIFT: u32>(
    bits: &[u8],
    hi: &[i8; BLOCK],
    lo: &[i8; BLOCK],
    consts: ByteConsts,
) -> __m256i {
    use super::avx2_packed::{combine, BlockPlanes};
    let planes = BlockPlanes::<1, SHIFT> {
        his: [hi],
        los: [lo],
        consts,
    };
    let ([hi], [lo]) = block_sums(bits, planes);
    combine::<SHIFT>(hi, lo)
}

super::avx2_packed::packed_group_dot!("avx2,fma,f16c", [const SHIFT: u32], Q16Row<'_, SHIFT>);
