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
use crate::cpu::kernels::qact::Q16Row;

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
/// to each row's sums. (A part of 16 columns of 5-bit values can pass
/// `i16`'s range, so each sum takes a `vpmulld`.)
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn pair_scaled_sums<const T: usize, const SHIFT: u32>(
    a: &[u8],
    b: &[u8],
    x: super::avx2_packed::BlockPlanes<'_, T, SHIFT>,
    sc: __m512i,
    sums: (&mut [__m512i; T], &mut [__m512i; T]),
) {
    super::vnni_packed_q4k::add_scaled_sums::<T, SHIFT>(pair_block_sums(a, b, x), sc, sums);
}

super::vnni_packed_q4k::q4k_pair_tile!(crate::cpu::kernels::packed_q5k::FiveBits, pair_scaled_sums);

super::vnni_packed::packed_pair_dot!([const SHIFT: u32], Q16Row<'_, SHIFT>, wide);
