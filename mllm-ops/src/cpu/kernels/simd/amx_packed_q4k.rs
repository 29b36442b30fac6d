//! AMX products of two packed Q4_K or Q5_K row groups (see `packed_q4k`)
//! with 16 activation rows: the steps of `vnni_packed_q4k`'s `pair_tile`,
//! with each sub-block's sums from one tile product per activation plane
//! (`amx`) instead of `vpdpbusd`. The sums are the same integers and the
//! float steps the same, in the same order, so the results equal the
//! AVX-512 kernels' bit for bit.
//!
//! Every function here is a safe `#[target_feature]` function that takes
//! configured tiles: callers must only reach it after detecting the
//! AVX-512 level's features and AMX (see `QuantKernel`).

/// Defines `amx_pair_dot::<SHIFT>`, the outputs of two consecutive packed
/// groups `a` and `b` for the 16 activation rows of `rows` (`out[t]` for
/// `a`, `out[16 + t]` for `b`), for a layout with packed Q4_K's header
/// whose sub-block bits `$bits` two groups give as values through
/// `$pair_values` (as `amx_packed::nibble_pair_values`).
macro_rules! q4k_amx_pair_dot {
    ($bits:ty, $pair_values:path) => {
        use std::arch::x86_64::*;

        use $crate::cpu::kernels::packed::GROUP_ROWS;
        use $crate::cpu::kernels::simd::amx::{TileRows, Tiles, TILE_ROWS};
        const _: () = assert!(
            $crate::cpu::kernels::packed_q4k::SUB_BLOCKS <= $crate::cpu::kernels::simd::amx::SPAN
        );

        /// The outputs of groups `a` and `b` for the 16 rows of `rows`, one
        /// super-block after the other: its values into the tiles, its tile
        /// products, then its float steps.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        pub(crate) fn amx_pair_dot<const SHIFT: u32>(
            tiles: &mut Tiles,
            a: &[u8],
            b: &[u8],
            rows: &TileRows<'_, SHIFT>,
            out: &mut [[f32; GROUP_ROWS]],
        ) {
            use $crate::cpu::kernels::packed_q4k::{SubBlockBits, SUB_BLOCKS};
            use $crate::cpu::kernels::simd::vnni_packed::store_pair;
            const SUPER_BYTES: usize = <$bits as SubBlockBits>::SUPER_BYTES;
            let nb = rows.blocks();
            let mut acc = [_mm512_setzero_ps(); TILE_ROWS];
            let len = nb / SUB_BLOCKS * SUPER_BYTES;
            let supers_a = a[..len].as_chunks::<SUPER_BYTES>().0;
            let supers_b = b[..len].as_chunks::<SUPER_BYTES>().0;
            for (s, (sa, sb)) in supers_a.iter().zip(supers_b).enumerate() {
                set_values(tiles, sa, sb);
                tiles.products(rows, s * SUB_BLOCKS, SUB_BLOCKS, false);
                add_super_block(&mut acc, tiles, rows, s, sa, sb);
            }
            store_pair(&acc, out);
        }

        /// Sets the values of super-block `sa` / `sb` (one per group) into
        /// the tiles.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        #[inline]
        fn set_values(tiles: &mut Tiles, sa: &[u8], sb: &[u8]) {
            use $crate::cpu::kernels::packed_q4k::{SubBlockBits, BITS_AT, SUB_BLOCKS};
            const BLOCK_BITS: usize = <$bits as SubBlockBits>::BLOCK_BITS;
            for j in 0..SUB_BLOCKS {
                let at = BITS_AT + BLOCK_BITS * j;
                let values = $pair_values(&sa[at..], &sb[at..]);
                $crate::cpu::kernels::simd::amx_packed::set_chunk_values(tiles, j, values);
            }
        }

        /// Adds super-block `s` (`sa` / `sb`, whose products the tiles
        /// hold) to the rows' outputs: per sub-block and row the float step
        /// of `vnni_packed_q4k`'s `pair_tile`.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        #[inline]
        fn add_super_block<const SHIFT: u32>(
            acc: &mut [__m512; TILE_ROWS],
            tiles: &Tiles,
            rows: &TileRows<'_, SHIFT>,
            s: usize,
            sa: &[u8],
            sb: &[u8],
        ) {
            use $crate::cpu::kernels::packed_q4k::{MINS_AT, SCALES_AT, SUB_BLOCKS};
            use $crate::cpu::kernels::simd::vnni_packed::f16x16;
            use $crate::cpu::kernels::simd::vnni_packed_q4k::u8x16;
            let d = f16x16(&sa[..16], &sb[..16]);
            let neg_dmin = _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(f16x16(&sa[16..32], &sb[16..32])),
                _mm512_set1_epi32(i32::MIN),
            ));
            for j in 0..SUB_BLOCKS {
                let i = s * SUB_BLOCKS + j;
                let (sc_at, m_at) = (SCALES_AT + GROUP_ROWS * j, MINS_AT + GROUP_ROWS * j);
                let sc = u8x16(&sa[sc_at..], &sb[sc_at..]);
                let m = u8x16(&sa[m_at..], &sb[m_at..]);
                let scales = (_mm512_mul_ps(d, sc), _mm512_mul_ps(neg_dmin, m));
                $crate::cpu::kernels::simd::amx_packed::add_sums(acc, tiles, rows, (j, i), scales);
            }
        }
    };
}

/// Q4_K's sub-blocks.
pub(crate) mod q4k {
    q4k_amx_pair_dot!(
        crate::cpu::kernels::packed_q4k::Nibbles,
        crate::cpu::kernels::simd::amx_packed::nibble_pair_values
    );
}

/// Q5_K's sub-blocks.
pub(crate) mod q5k {
    q4k_amx_pair_dot!(
        crate::cpu::kernels::packed_q5k::FiveBits,
        crate::cpu::kernels::simd::vnni_packed_q5::pair_values
    );
}
