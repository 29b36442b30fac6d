//! AVX2 product of a packed Q4_K row group (see `packed_q4k`) with one to
//! four 16-bit activation rows: per sub-block the packed Q4 block sums of
//! `avx2_packed`, then its float step with the sub-block's scales `d·sc`
//! and offsets `−dmin·m`, made from the super-block header (exact f32
//! products, so the same numbers the portable kernel uses).
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::qact::Q16Row;

/// Defines `tile::<T>`, the eight outputs of one packed group for `T`
/// activation rows in a K-quant layout with packed Q4_K's super-block
/// header and the sub-block bits `$bits` (a `packed_q4k::SubBlockBits`
/// type), over a module's block
/// sums `$sums` of one sub-block's bits (as `avx2_packed::block_sums`).
/// The AVX2, AVX-VNNI and AVX-512 VNNI kernels of packed Q4_K (Q4
/// nibbles) and packed Q5_K (Q5 bits) share it.
macro_rules! q4k_tile {
    ($features:literal, $sums:path, $bits:ty) => {
        /// The eight outputs of one packed group for `T` activation rows.
        #[target_feature(enable = $features)]
        #[inline]
        fn tile<const T: usize, const SHIFT: u32>(
            group: &[u8],
            xs: &[Q16Row<'_, SHIFT>],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) -> [__m256; T] {
            use $crate::cpu::kernels::packed_q4k::{
                SubBlockBits, BITS_AT, MINS_AT, SCALES_AT, SUB_BLOCKS,
            };
            use $crate::cpu::kernels::simd::avx2_packed::{
                add_block, f16x8, ByteConsts, RowPlanes,
            };
            use $crate::cpu::kernels::simd::avx2_packed_q4k::u8x8;
            const BLOCK_BITS: usize = <$bits as SubBlockBits>::BLOCK_BITS;
            const SUPER_BYTES: usize = <$bits as SubBlockBits>::SUPER_BYTES;
            let xs: [Q16Row<'_, SHIFT>; T] = std::array::from_fn(|t| xs[t]);
            let nb = xs[0].d.len();
            let planes = RowPlanes::new(xs, nb, ByteConsts::new());
            let mut acc = [_mm256_setzero_ps(); T];
            let supers = group[..nb / SUB_BLOCKS * SUPER_BYTES]
                .as_chunks::<SUPER_BYTES>()
                .0;
            let d_supers = xs.map(|x| x.d.as_chunks::<SUB_BLOCKS>().0);
            let s_supers = xs.map(|x| x.s.as_chunks::<SUB_BLOCKS>().0);
            let mut ahead = $crate::cpu::kernels::simd::prefetch::Streams::new(group, 1, reads);
            for (s, sb) in supers.iter().enumerate() {
                let (dxs, sxs) = (d_supers.map(|d| &d[s]), s_supers.map(|v| &v[s]));
                let d = f16x8(&sb[..16]);
                let neg_dmin = _mm256_xor_ps(f16x8(&sb[16..32]), _mm256_set1_ps(-0.0));
                for j in 0..SUB_BLOCKS {
                    let i = s * SUB_BLOCKS + j;
                    let block_bytes = SUPER_BYTES / SUB_BLOCKS;
                    ahead.next(block_bytes);
                    let bits = &sb[BITS_AT + BLOCK_BITS * j..];
                    if T > 1 {
                        $crate::cpu::kernels::simd::prefetch::block_into_l1(bits, BLOCK_BITS);
                    }
                    let (sum_hi, sum_lo) = $sums(bits, planes.block(i));
                    let sc = u8x8(&sb[SCALES_AT + GROUP_ROWS * j..]);
                    let m = u8x8(&sb[MINS_AT + GROUP_ROWS * j..]);
                    let scales = (_mm256_mul_ps(d, sc), _mm256_mul_ps(neg_dmin, m));
                    for t in 0..T {
                        let x = (dxs[t][j], sxs[t][j]);
                        acc[t] = add_block::<SHIFT>(acc[t], scales, sum_hi[t], sum_lo[t], x);
                    }
                }
            }
            acc
        }
    };
}

pub(crate) use q4k_tile;

super::avx2_packed::nibble_block_sums!();

q4k_tile!(
    "avx2,fma,f16c",
    block_sums,
    crate::cpu::kernels::packed_q4k::Nibbles
);

/// The eight bytes at the start of `b` as f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn u8x8(b: &[u8]) -> __m256 {
    let bytes: [u8; 8] = b[..8].try_into().expect("eight bytes");
    let v = _mm_cvtsi64_si128(i64::from_le_bytes(bytes));
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
}

super::avx2_packed::packed_group_dot!("avx2,fma,f16c", [const SHIFT: u32], Q16Row<'_, SHIFT>);
