//! AVX2 product of a packed Q5_K row group (see `packed_q5k`) with one to
//! four 16-bit activation rows: per sub-block the packed Q5 block sums of
//! `avx2_packed_q5`, then the float step of packed Q4_K with the
//! sub-block's scales `d·sc` and offsets `−dmin·m` (`q4k_tile`).
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::qact::Q16Row;

super::avx2_packed_q5::five_bit_block_sums!();

super::avx2_packed_q4k::q4k_tile!(
    "avx2,fma,f16c",
    block_sums,
    crate::cpu::kernels::packed_q5k::FiveBits
);

super::avx2_packed::packed_group_dot!("avx2,fma,f16c", [const SHIFT: u32], Q16Row<'_, SHIFT>);
