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
use super::avx2_packed::{add_block, f16x8, word};
use super::avx2_packed_q5::values;
use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::packed_q5::Q5_PACKED_BLOCK_BYTES;
use crate::cpu::kernels::qact::{Q16Row, BLOCK, WIDE};

/// The eight outputs of one packed group for `T` activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn tile<const T: usize>(group: &[u8], xs: &[Q16Row<'_, WIDE>]) -> [__m256; T] {
    let xs: [Q16Row<'_, WIDE>; T] = std::array::from_fn(|t| xs[t]);
    let nb = xs[0].d.len();
    let his = xs.map(|x| &x.hi.as_chunks::<BLOCK>().0[..nb]);
    let los = xs.map(|x| &x.lo.as_chunks::<BLOCK>().0[..nb]);
    let mut acc = [_mm256_setzero_ps(); T];
    let blocks = group[..nb * Q5_PACKED_BLOCK_BYTES]
        .as_chunks::<Q5_PACKED_BLOCK_BYTES>()
        .0;
    for (i, blk) in blocks.iter().enumerate() {
        let w = values(blk);
        let scales = (f16x8(&blk[..16]), f16x8(&blk[16..32]));
        for t in 0..T {
            let (h, l) = (&his[t][i], &los[t][i]);
            let (mut sum_hi, mut sum_lo) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for (c, [w_lo, w_hi]) in w.iter().enumerate() {
                sum_hi = _mm256_dpbusd_epi32(sum_hi, *w_lo, word(h, 4 * c));
                sum_hi = _mm256_dpbusd_epi32(sum_hi, *w_hi, word(h, 16 + 4 * c));
                sum_lo = _mm256_dpbusd_epi32(sum_lo, *w_lo, word(l, 4 * c));
                sum_lo = _mm256_dpbusd_epi32(sum_lo, *w_hi, word(l, 16 + 4 * c));
            }
            acc[t] = add_block(acc[t], scales, sum_hi, sum_lo, xs[t], i);
        }
    }
    acc
}

super::avx2_packed::packed_group_dot!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    Q16Row<'_, WIDE>
);
