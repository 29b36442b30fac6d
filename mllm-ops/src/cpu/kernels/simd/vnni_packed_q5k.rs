//! AVX-512 VNNI product of a packed Q5_K row group (see `packed_q5k`) with
//! one to four 16-bit activation rows, on 256-bit vectors (AVX-512VL), and
//! of two consecutive groups at once on 512-bit vectors (`pair_dot`): the
//! packed Q5 block sums of `vnni_packed_q5` (`dpbusd`, the same integers as
//! AVX2's) and the same float steps as `avx2_packed_q5k`, so the same bits.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA, F16C, AVX-512F, AVX-512VL,
//! AVX-512BW and AVX-512 VNNI (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use super::vnni_packed::store_pair;
use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::qact::{Q16Row, BYTE};

super::vnni_packed_q5::five_bit_block_sums!();

super::avx2_packed_q4k::q4k_tile!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    block_sums,
    crate::cpu::kernels::packed_q5k::FiveBits
);

super::avx2_packed::packed_group_dot!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    [const SHIFT: u32], Q16Row<'_, SHIFT>
);

super::vnni_packed_q5::five_bit_pair_block_sums!(false);

/// The packed Q5_K `$scaled_sums` of `vnni_packed_q4k::q4k_pair_tile`:
/// the block sums of two groups' sub-block times its scales `sc`, added
/// to each row's `sums_hi` and `sums_lo` (the low plane's only for 16-bit
/// rows), one `vpmulld` and one add each. (A part of 16 columns of 5-bit
/// values can pass `i16`'s range, so no `vpdpwssd` as for Q4_K.)
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn pair_scaled_sums<const T: usize, const SHIFT: u32>(
    a: &[u8],
    b: &[u8],
    x: super::avx2_packed::BlockPlanes<'_, T, SHIFT>,
    sc: __m512i,
    (sums_hi, sums_lo): (&mut [__m512i; T], &mut [__m512i; T]),
) {
    let (sum_hi, sum_lo) = pair_block_sums(a, b, x);
    for t in 0..T {
        sums_hi[t] = _mm512_add_epi32(sums_hi[t], _mm512_mullo_epi32(sum_hi[t], sc));
        if SHIFT != BYTE {
            sums_lo[t] = _mm512_add_epi32(sums_lo[t], _mm512_mullo_epi32(sum_lo[t], sc));
        }
    }
}

super::vnni_packed_q4k::q4k_pair_tile!(crate::cpu::kernels::packed_q5k::FiveBits, pair_scaled_sums);

super::vnni_packed::packed_pair_dot!([const SHIFT: u32], Q16Row<'_, SHIFT>, wide);
