//! AVX-512 VNNI product of a packed Q5 row group (see `packed_q5`) with one
//! to four 16-bit activation rows, on 256-bit vectors (AVX-512VL), and of
//! two consecutive groups at once on 512-bit vectors (`pair_dot`): the
//! five-bit values of `avx2_packed_q5` with `dpbusd` in place of `maddubs`
//! and `madd`, the same 32-bit block sums and the same float steps, so the
//! same bits.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA, F16C, AVX-512F, AVX-512VL,
//! AVX-512BW and AVX-512 VNNI (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use super::avx2_i8::load32;
use super::vnni_packed::{join, store_pair};
use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::packed_q5::{Q5_PACKED_BLOCK_BYTES, TOP_IN_BITS};
use crate::cpu::kernels::qact::Q16Row;

/// `avx2_packed_q5`'s block sums with `dpbusd`: the same 32-bit sums.
///
/// `five_bit_block_sums!()` defines it in the calling module: each packed
/// format's kernels get their own copy, so that each instance has one
/// caller, its tile, and is inlined into it. Without arguments it uses
/// AVX-512VL's `dpbusd`; `five_bit_block_sums!(features, dpbusd)` names
/// the target features and the 256-bit `dpbusd` intrinsic (AVX-VNNI's).
macro_rules! five_bit_block_sums {
    () => {
        $crate::cpu::kernels::simd::vnni_packed_q5::five_bit_block_sums!(
            "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
            _mm256_dpbusd_epi32
        );
    };
    ($features:literal, $dpbusd:path) => {
        #[target_feature(enable = $features)]
        #[inline]
        fn block_sums<const T: usize, const SHIFT: u32>(
            bits: &[u8],
            x: $crate::cpu::kernels::simd::avx2_packed::BlockPlanes<'_, T, SHIFT>,
        ) -> ([__m256i; T], [__m256i; T]) {
            use $crate::cpu::kernels::qact::BLOCK;
            use $crate::cpu::kernels::simd::avx2_packed::{word, BlockPlanes};
            use $crate::cpu::kernels::simd::avx2_packed_q5::values;
            let w = values(bits, x.consts);
            let mut sum_hi = [_mm256_setzero_si256(); T];
            let mut sum_lo = [_mm256_setzero_si256(); T];
            let plane = |x: &[i8; BLOCK], sum: __m256i| {
                w.iter().enumerate().fold(sum, |sum, (c, [w_lo, w_hi])| {
                    let sum = $dpbusd(sum, *w_lo, word(x, 4 * c));
                    $dpbusd(sum, *w_hi, word(x, 16 + 4 * c))
                })
            };
            for t in 0..T {
                sum_hi[t] = plane(x.his[t], sum_hi[t]);
                if BlockPlanes::<T, SHIFT>::HAS_LO {
                    sum_lo[t] = plane(x.los[t], sum_lo[t]);
                }
            }
            (sum_hi, sum_lo)
        }
    };
}

pub(crate) use five_bit_block_sums;

five_bit_block_sums!();

super::avx2_packed::scaled_block_tile!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    Q5_PACKED_BLOCK_BYTES,
    block_sums
);

super::avx2_packed::packed_group_dot!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    [const SHIFT: u32], Q16Row<'_, SHIFT>
);

/// `values` of two groups' blocks at once (`a`'s bits in the low halves,
/// `b`'s in the high ones).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn pair_values(a: &[u8], b: &[u8]) -> [[__m512i; 2]; 4] {
    let low4 = _mm512_set1_epi8(0x0F);
    let bit4 = _mm512_set1_epi8(0x10);
    let mut top = join(load32(&a[TOP_IN_BITS..]), load32(&b[TOP_IN_BITS..]));
    std::array::from_fn(|c| {
        let v = join(load32(&a[32 * c..]), load32(&b[32 * c..]));
        let w = [
            _mm512_or_si512(
                _mm512_and_si512(v, low4),
                _mm512_and_si512(_mm512_slli_epi16::<4>(top), bit4),
            ),
            _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4),
                _mm512_and_si512(_mm512_slli_epi16::<3>(top), bit4),
            ),
        ];
        top = _mm512_srli_epi16::<2>(top);
        w
    })
}

/// `block_sums` of two groups' blocks at once (`a`'s bits in the low
/// halves, `b`'s in the high ones): the same 32-bit sums lane by lane.
///
/// `five_bit_pair_block_sums!(first_row_written_out)` defines it in the
/// calling module: each packed format's kernels get their own copy, so
/// that each instance has one caller, its tile, and is inlined into it.
/// `first_row_written_out` (a `bool`) says whether the first activation
/// row's products take `dpbusd_words`'s written-out form: the Q5_0
/// and Q5_1 tiles need it, the Q5_K tiles compile without the broadcasts
/// from general registers it removes.
macro_rules! five_bit_pair_block_sums {
    ($first_row_written_out:expr) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        #[inline]
        fn pair_block_sums<const T: usize, const SHIFT: u32>(
            a: &[u8],
            b: &[u8],
            x: $crate::cpu::kernels::simd::avx2_packed::BlockPlanes<'_, T, SHIFT>,
        ) -> ([__m512i; T], [__m512i; T]) {
            use $crate::cpu::kernels::qact::BLOCK;
            use $crate::cpu::kernels::simd::avx2_packed::BlockPlanes;
            use $crate::cpu::kernels::simd::vnni_packed::dpbusd_words;
            use $crate::cpu::kernels::simd::vnni_packed_q5::pair_values;
            let w = pair_values(a, b);
            let (w_lo, w_hi) = (w.map(|[lo, _]| lo), w.map(|[_, hi]| hi));
            let mut sum_hi = [_mm512_setzero_si512(); T];
            let mut sum_lo = [_mm512_setzero_si512(); T];
            let plane = |x: &[i8; BLOCK], sum: __m512i, t: usize| {
                let written_out = T == 1 || ($first_row_written_out && t == 0);
                let sum = dpbusd_words::<T, 0>(sum, w_lo, x, written_out);
                dpbusd_words::<T, 16>(sum, w_hi, x, written_out)
            };
            for t in 0..T {
                sum_hi[t] = plane(x.his[t], sum_hi[t], t);
                if BlockPlanes::<T, SHIFT>::HAS_LO {
                    sum_lo[t] = plane(x.los[t], sum_lo[t], t);
                }
            }
            (sum_hi, sum_lo)
        }
    };
}

pub(crate) use five_bit_pair_block_sums;

five_bit_pair_block_sums!(true);

super::vnni_packed::scaled_block_pair_tile!(Q5_PACKED_BLOCK_BYTES, pair_block_sums);

super::vnni_packed::packed_pair_dot!([const SHIFT: u32], Q16Row<'_, SHIFT>, wide);
