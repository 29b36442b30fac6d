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
use super::avx2_packed::word;
use super::avx2_packed_q5::values;
use super::vnni_packed::{join, store_pair, word16};
use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::packed_q5::{Q5_PACKED_BLOCK_BYTES, TOP_IN_BITS};
use crate::cpu::kernels::qact::{Q16Row, BLOCK, WIDE};

/// `avx2_packed_q5`'s block sums with `dpbusd`: the same 32-bit sums.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn block_sums<const T: usize>(
    bits: &[u8],
    his: [&[i8; BLOCK]; T],
    los: [&[i8; BLOCK]; T],
) -> ([__m256i; T], [__m256i; T]) {
    let w = values(bits);
    let mut sum_hi = [_mm256_setzero_si256(); T];
    let mut sum_lo = [_mm256_setzero_si256(); T];
    for t in 0..T {
        for (c, [w_lo, w_hi]) in w.iter().enumerate() {
            let (h, l) = (his[t], los[t]);
            sum_hi[t] = _mm256_dpbusd_epi32(sum_hi[t], *w_lo, word(h, 4 * c));
            sum_hi[t] = _mm256_dpbusd_epi32(sum_hi[t], *w_hi, word(h, 16 + 4 * c));
            sum_lo[t] = _mm256_dpbusd_epi32(sum_lo[t], *w_lo, word(l, 4 * c));
            sum_lo[t] = _mm256_dpbusd_epi32(sum_lo[t], *w_hi, word(l, 16 + 4 * c));
        }
    }
    (sum_hi, sum_lo)
}

super::avx2_packed::scaled_block_tile!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    Q5_PACKED_BLOCK_BYTES,
    block_sums
);

super::avx2_packed::packed_group_dot!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    Q16Row<'_, WIDE>
);

/// `values` of two groups' blocks at once (`a`'s bits in the low halves,
/// `b`'s in the high ones).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn pair_values(a: &[u8], b: &[u8]) -> [[__m512i; 2]; 4] {
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
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn pair_block_sums<const T: usize>(
    a: &[u8],
    b: &[u8],
    his: [&[i8; BLOCK]; T],
    los: [&[i8; BLOCK]; T],
) -> ([__m512i; T], [__m512i; T]) {
    let w = pair_values(a, b);
    let mut sum_hi = [_mm512_setzero_si512(); T];
    let mut sum_lo = [_mm512_setzero_si512(); T];
    for t in 0..T {
        for (c, [w_lo, w_hi]) in w.iter().enumerate() {
            let (h, l) = (his[t], los[t]);
            sum_hi[t] = _mm512_dpbusd_epi32(sum_hi[t], *w_lo, word16(h, 4 * c));
            sum_hi[t] = _mm512_dpbusd_epi32(sum_hi[t], *w_hi, word16(h, 16 + 4 * c));
            sum_lo[t] = _mm512_dpbusd_epi32(sum_lo[t], *w_lo, word16(l, 4 * c));
            sum_lo[t] = _mm512_dpbusd_epi32(sum_lo[t], *w_hi, word16(l, 16 + 4 * c));
        }
    }
    (sum_hi, sum_lo)
}

super::vnni_packed::scaled_block_pair_tile!(Q5_PACKED_BLOCK_BYTES, pair_block_sums);

super::vnni_packed::packed_pair_dot!(Q16Row<'_, WIDE>);
