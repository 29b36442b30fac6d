//! AVX-512 VNNI product of a packed Q5 row group (see `packed_q5`) with one
//! to four 16-bit activation rows, on 256-bit vectors (AVX-512VL): the
//! five-bit values of `avx2_packed_q5` with `dpbusd` in place of `maddubs`
//! and `madd`, the same 32-bit block sums and the same float steps, so the
//! same bits.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA, F16C, AVX-512F, AVX-512VL,
//! AVX-512BW and AVX-512 VNNI (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use super::avx2_packed::word;
use super::avx2_packed_q5::values;
use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::packed_q5::Q5_PACKED_BLOCK_BYTES;
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
