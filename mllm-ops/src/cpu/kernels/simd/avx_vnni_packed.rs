//! AVX-VNNI products of the packed integer formats (Q4, Q5, Q4_K, Q5_K,
//! Q6_K, Q8_0) with one to four activation rows: the 256-bit kernels of the
//! `vnni_packed*` modules with AVX-VNNI's VEX-encoded `vpdpbusd`, which CPUs
//! without AVX-512 have (Intel's since Alder Lake), in place of AVX-512VL's.
//! One `dpbusd` replaces AVX2's `maddubs`, 16-bit add and `madd`; the
//! 32-bit block sums are the same integers and the float steps after them
//! the same operations in the same order, so every result equals the AVX2
//! kernel's bit for bit.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA, F16C and AVX-VNNI (see
//! `QuantKernel`).

/// Packed Q4_0 / Q4_1 (`packed`).
pub(crate) mod q4 {
    use std::arch::x86_64::*;

    use crate::cpu::kernels::packed::{GROUP_ROWS, PACKED_BLOCK_BYTES, TILE_TOKENS};
    use crate::cpu::kernels::qact::Q16Row;
    use crate::cpu::kernels::simd::avx2::store;

    crate::cpu::kernels::simd::vnni_packed::nibble_block_sums!(
        "avx2,fma,f16c,avxvnni",
        _mm256_dpbusd_avx_epi32
    );

    crate::cpu::kernels::simd::avx2_packed::scaled_block_tile!(
        "avx2,fma,f16c,avxvnni",
        PACKED_BLOCK_BYTES,
        block_sums
    );

    crate::cpu::kernels::simd::avx2_packed::packed_group_dot!(
        "avx2,fma,f16c,avxvnni",
        [const SHIFT: u32],
        Q16Row<'_, SHIFT>
    );
}

/// Packed Q5_0 / Q5_1 (`packed_q5`).
pub(crate) mod q5 {
    use std::arch::x86_64::*;

    use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
    use crate::cpu::kernels::packed_q5::Q5_PACKED_BLOCK_BYTES;
    use crate::cpu::kernels::qact::Q16Row;
    use crate::cpu::kernels::simd::avx2::store;

    crate::cpu::kernels::simd::vnni_packed_q5::five_bit_block_sums!(
        "avx2,fma,f16c,avxvnni",
        _mm256_dpbusd_avx_epi32
    );

    crate::cpu::kernels::simd::avx2_packed::scaled_block_tile!(
        "avx2,fma,f16c,avxvnni",
        Q5_PACKED_BLOCK_BYTES,
        block_sums
    );

    crate::cpu::kernels::simd::avx2_packed::packed_group_dot!(
        "avx2,fma,f16c,avxvnni",
        [const SHIFT: u32],
        Q16Row<'_, SHIFT>
    );
}

/// Packed Q4_K (`packed_q4k`).
pub(crate) mod q4k {
    use std::arch::x86_64::*;

    use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
    use crate::cpu::kernels::qact::Q16Row;
    use crate::cpu::kernels::simd::avx2::store;

    crate::cpu::kernels::simd::vnni_packed::nibble_block_sums!(
        "avx2,fma,f16c,avxvnni",
        _mm256_dpbusd_avx_epi32
    );

    crate::cpu::kernels::simd::avx2_packed_q4k::q4k_tile!(
        "avx2,fma,f16c,avxvnni",
        block_sums,
        crate::cpu::kernels::packed_q4k::Nibbles
    );

    crate::cpu::kernels::simd::avx2_packed::packed_group_dot!(
        "avx2,fma,f16c,avxvnni",
        [const SHIFT: u32],
        Q16Row<'_, SHIFT>
    );
}

/// Packed Q5_K (`packed_q5k`).
pub(crate) mod q5k {
    use std::arch::x86_64::*;

    use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
    use crate::cpu::kernels::qact::Q16Row;
    use crate::cpu::kernels::simd::avx2::store;

    crate::cpu::kernels::simd::vnni_packed_q5::five_bit_block_sums!(
        "avx2,fma,f16c,avxvnni",
        _mm256_dpbusd_avx_epi32
    );

    crate::cpu::kernels::simd::avx2_packed_q4k::q4k_tile!(
        "avx2,fma,f16c,avxvnni",
        block_sums,
        crate::cpu::kernels::packed_q5k::FiveBits
    );

    crate::cpu::kernels::simd::avx2_packed::packed_group_dot!(
        "avx2,fma,f16c,avxvnni",
        [const SHIFT: u32],
        Q16Row<'_, SHIFT>
    );
}

/// Packed Q6_K (`packed_q6k`).
pub(crate) mod q6k {
    use std::arch::x86_64::*;

    use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
    use crate::cpu::kernels::packed_q6k::Q6KInput;
    use crate::cpu::kernels::simd::avx2::store;

    crate::cpu::kernels::simd::vnni_packed_q6k::q6k_plane_sums!(
        "avx2,fma,f16c,avxvnni",
        _mm256_dpbusd_avx_epi32
    );

    crate::cpu::kernels::simd::avx2_packed_q6k::q6k_tile!("avx2,fma,f16c,avxvnni", plane_sums);

    crate::cpu::kernels::simd::avx2_packed::packed_group_dot!(
        "avx2,fma,f16c,avxvnni",
        [const SHIFT: u32],
        Q6KInput<'_, SHIFT>
    );
}

/// Packed Q8_0 (`packed_q8`).
pub(crate) mod q8 {
    use std::arch::x86_64::*;

    use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
    use crate::cpu::kernels::packed_q8::Q8Input;
    use crate::cpu::kernels::simd::avx2::store;

    crate::cpu::kernels::simd::vnni_packed_q8::q8_tile!(
        "avx2,fma,f16c,avxvnni",
        _mm256_dpbusd_avx_epi32
    );

    crate::cpu::kernels::simd::avx2_packed::packed_group_dot!(
        "avx2,fma,f16c,avxvnni",
        [const SHIFT: u32],
        Q8Input<'_, SHIFT>
    );
}
