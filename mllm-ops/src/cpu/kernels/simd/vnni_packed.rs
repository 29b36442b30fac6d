//! AVX-512 VNNI product of a packed Q4 row group (see `packed`) with one to
//! four 16-bit activation rows, on 256-bit vectors (AVX-512VL).
//!
//! The layout and the arithmetic are those of `avx2_packed`, with one
//! `dpbusd` (four unsigned nibble × signed activation byte products summed
//! into each row's 32-bit lane) in place of `maddubs`, the 16-bit add and
//! the final `madd`. The 32-bit block sums are the same integers, and the
//! float steps after them are the same operations in the same order, so
//! the results equal the AVX2 kernel's bit for bit.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA, F16C, AVX-512F, AVX-512VL,
//! AVX-512BW and AVX-512 VNNI (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use super::avx2_i8::load32;
use super::avx2_packed::{add_block, block_scales, word};
use crate::cpu::kernels::packed::{GROUP_ROWS, PACKED_BLOCK_BYTES, TILE_TOKENS};
use crate::cpu::kernels::qact::{Q16Row, BLOCK, WIDE};

/// The eight outputs of one packed group for `T` activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn tile<const T: usize>(group: &[u8], xs: &[Q16Row<'_, WIDE>]) -> [__m256; T] {
    let xs: [Q16Row<'_, WIDE>; T] = std::array::from_fn(|t| xs[t]);
    let nb = xs[0].d.len();
    let his = xs.map(|x| &x.hi.as_chunks::<BLOCK>().0[..nb]);
    let los = xs.map(|x| &x.lo.as_chunks::<BLOCK>().0[..nb]);
    let nibble = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); T];
    let blocks = group[..nb * PACKED_BLOCK_BYTES]
        .as_chunks::<PACKED_BLOCK_BYTES>()
        .0;
    for (i, blk) in blocks.iter().enumerate() {
        let mut sum_hi = [_mm256_setzero_si256(); T];
        let mut sum_lo = [_mm256_setzero_si256(); T];
        for j in 0..4 {
            let v = load32(&blk[32 + 32 * j..]);
            let w_lo = _mm256_and_si256(v, nibble);
            let w_hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble);
            for t in 0..T {
                let (h, l) = (&his[t][i], &los[t][i]);
                sum_hi[t] = _mm256_dpbusd_epi32(sum_hi[t], w_lo, word(h, 4 * j));
                sum_hi[t] = _mm256_dpbusd_epi32(sum_hi[t], w_hi, word(h, 16 + 4 * j));
                sum_lo[t] = _mm256_dpbusd_epi32(sum_lo[t], w_lo, word(l, 4 * j));
                sum_lo[t] = _mm256_dpbusd_epi32(sum_lo[t], w_hi, word(l, 16 + 4 * j));
            }
        }
        let scales = block_scales(blk);
        for t in 0..T {
            acc[t] = add_block(acc[t], scales, sum_hi[t], sum_lo[t], xs[t], i);
        }
    }
    acc
}

super::avx2_packed::packed_group_dot!("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni");
