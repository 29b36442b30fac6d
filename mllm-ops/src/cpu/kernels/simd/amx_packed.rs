//! AMX products of two packed Q4, Q5 or Q8_0 row groups (see `packed`,
//! `packed_q5` and `packed_q8`) with 16 activation rows (Q8_0: with many
//! tiles of 16 rows, each pair's B operands set once for all of them):
//! the steps of `vnni_packed`'s `scaled_block_pair_tile` and of
//! `vnni_packed_q8`'s `pair_tile`, with the blocks' sums from tile
//! products (`amx`), eight blocks at a time. The same integers and float
//! steps in the same order, so the results equal the AVX-512 kernels' bit
//! for bit.
//!
//! Every function here is a safe `#[target_feature]` function that takes
//! configured tiles: callers must only reach it after detecting the
//! AVX-512 level's features and AMX (see `QuantKernel`).

use std::arch::x86_64::*;

use super::amx::{TileRows, Tiles, TILE_ROWS};
use super::avx2_i8::load32;
use super::vnni_packed::{join, pair_add_block};

/// The values of two groups' packed Q4 blocks or Q4_K sub-blocks (`a`'s
/// in the low halves, `b`'s in the high ones) per chunk of the packed
/// nibble layout: the low nibbles, then the high ones.
#[target_feature(enable = "avx2,avx512f,avx512bw")]
#[inline]
pub(crate) fn nibble_pair_values(a: &[u8], b: &[u8]) -> [[__m512i; 2]; 4] {
    let low4 = _mm512_set1_epi8(0x0F);
    std::array::from_fn(|c| {
        let v = join(load32(&a[32 * c..]), load32(&b[32 * c..]));
        [
            _mm512_and_si512(v, low4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4),
        ]
    })
}

/// Sets sub-block `j`'s values in `tiles` from a group pair's values per
/// chunk of the packed nibble layout (`[low, high]` for each of the four
/// chunks, as [`nibble_pair_values`] gives them): the four
/// chunks' low values are its first 16 columns, their high values the last.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn set_chunk_values(tiles: &mut Tiles, j: usize, chunks: [[__m512i; 2]; 4]) {
    let [[l0, h0], [l1, h1], [l2, h2], [l3, h3]] = chunks;
    tiles.set_values(j, [l0, l1, l2, l3, h0, h1, h2, h3]);
}

/// Adds activation block `i` to every row's outputs `acc` from the tiles'
/// sums of sub-block `j`: the float step `pair_add_block` of the AVX-512
/// kernels with the scales and offsets `scales` of the 16 weight rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn add_sums<const SHIFT: u32>(
    acc: &mut [__m512; TILE_ROWS],
    tiles: &Tiles,
    rows: &TileRows<'_, SHIFT>,
    (j, i): (usize, usize),
    scales: (__m512, __m512),
) {
    for (t, acc) in acc.iter_mut().enumerate() {
        let (hi, lo) = tiles.sums::<SHIFT>(j, t);
        *acc = pair_add_block::<SHIFT>(*acc, scales, hi, lo, rows.block_scale(t, i));
    }
}

/// Defines `amx_pair_dot::<SHIFT>`, the outputs of two consecutive packed
/// groups `a` and `b` for the 16 activation rows of `rows` (`out[t]` for
/// `a`, `out[16 + t]` for `b`), for a layout of `$block_bytes` per block
/// that starts with the eight rows' f16 scales and offsets, whose bits
/// two groups give as values through `$pair_values` (as
/// [`nibble_pair_values`]).
macro_rules! scaled_block_amx_pair_dot {
    ($block_bytes:expr, $pair_values:path) => {
        use std::arch::x86_64::*;

        use $crate::cpu::kernels::packed::{GROUP_ROWS, NIBBLES_AT};
        use $crate::cpu::kernels::simd::amx::{TileRows, Tiles, SPAN, TILE_ROWS};

        /// The outputs of groups `a` and `b` for the 16 rows of `rows`, a
        /// span of blocks at a time: their values into the tiles, their
        /// tile products, then their float steps.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        pub(crate) fn amx_pair_dot<const SHIFT: u32>(
            tiles: &mut Tiles,
            a: &[u8],
            b: &[u8],
            rows: &TileRows<'_, SHIFT>,
            out: &mut [[f32; GROUP_ROWS]],
        ) {
            use $crate::cpu::kernels::simd::amx_packed::{add_sums, set_chunk_values};
            use $crate::cpu::kernels::simd::vnni_packed::{f16x16, store_pair};
            let nb = rows.blocks();
            let mut acc = [_mm512_setzero_ps(); TILE_ROWS];
            let blocks_a = a[..nb * $block_bytes].as_chunks::<{ $block_bytes }>().0;
            let blocks_b = b[..nb * $block_bytes].as_chunks::<{ $block_bytes }>().0;
            let spans = blocks_a.chunks(SPAN).zip(blocks_b.chunks(SPAN));
            for (span, (sa, sb)) in spans.enumerate() {
                for (j, (ka, kb)) in sa.iter().zip(sb).enumerate() {
                    let values = $pair_values(&ka[NIBBLES_AT..], &kb[NIBBLES_AT..]);
                    set_chunk_values(tiles, j, values);
                }
                tiles.products(rows, span * SPAN, sa.len(), false);
                for (j, (ka, kb)) in sa.iter().zip(sb).enumerate() {
                    let i = span * SPAN + j;
                    let d = f16x16(&ka[..16], &kb[..16]);
                    let m = f16x16(&ka[16..32], &kb[16..32]);
                    add_sums(&mut acc, tiles, rows, (j, i), (d, m));
                }
            }
            store_pair(&acc, out);
        }
    };
}

/// Q4_0 and Q4_1 blocks.
pub(crate) mod q4 {
    scaled_block_amx_pair_dot!(
        crate::cpu::kernels::packed::PACKED_BLOCK_BYTES,
        crate::cpu::kernels::simd::amx_packed::nibble_pair_values
    );
}

/// Q5_0 and Q5_1 blocks.
pub(crate) mod q5 {
    scaled_block_amx_pair_dot!(
        crate::cpu::kernels::packed_q5::Q5_PACKED_BLOCK_BYTES,
        crate::cpu::kernels::simd::vnni_packed_q5::pair_values
    );
}

/// Q8_0 blocks: signed weights, whose chunks of the two groups, joined,
/// are already the B operand's rows.
pub(crate) mod q8 {
    use super::*;
    use crate::cpu::kernels::packed::GROUP_ROWS;
    use crate::cpu::kernels::packed_q8::Q8_PACKED_BLOCK_BYTES;
    use crate::cpu::kernels::qact::{BYTE, NARROW};
    use crate::cpu::kernels::simd::amx::SPAN;
    use crate::cpu::kernels::simd::avx2_i8::load32;
    use crate::cpu::kernels::simd::inline_array::from_fn;
    use crate::cpu::kernels::simd::vnni_packed::{f16x16, join};

    /// Adds sub-block `j` of the last tile products (activation block `i`)
    /// to the outputs `acc` of the 16 rows of `rows`, `d` the 16 weight
    /// rows' scales: per row `acc = fma(2^SHIFT·Σ w·hi + Σ w·lo, d·d_x,
    /// acc)`, the float step of `vnni_packed_q8`'s `pair_tile`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    #[inline]
    fn block_step<const SHIFT: u32>(
        acc: &mut [__m512; TILE_ROWS],
        tiles: &Tiles,
        rows: &TileRows<'_, SHIFT>,
        (j, i): (usize, usize),
        d: __m512,
    ) {
        for (t, acc) in acc.iter_mut().enumerate() {
            let (hi, lo) = tiles.sums::<SHIFT>(j, t);
            let p = if SHIFT == BYTE {
                hi
            } else {
                _mm512_add_epi32(_mm512_slli_epi32::<{ NARROW }>(hi), lo)
            };
            let (dx, _) = rows.block_scale(t, i);
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(dx));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, *acc);
        }
    }

    /// The outputs of every pair of consecutive groups in `groups` (of
    /// `group_bytes` each) for the row tiles `row_tiles` (16 rows each;
    /// `n` rows in all, at least the tiles'): `out[2n·p + t]` and
    /// `out[2n·p + n + t]` for pair `p` and row `t`. Span by span of
    /// blocks: each pair's values go into the B operands once for all the
    /// tiles, and each row's outputs pass from span to span through `out`,
    /// so that every row gets the float steps of `vnni_packed_q8`'s
    /// `pair_tile` in the same order ([`block_step`]).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub(crate) fn pairs<const SHIFT: u32>(
        tiles: &mut Tiles,
        (groups, group_bytes): (&[u8], usize),
        row_tiles: &[TileRows<'_, SHIFT>],
        (out, n): (&mut [[f32; GROUP_ROWS]], usize),
    ) {
        use crate::cpu::kernels::simd::amx_kquant::{so_far, store_row};
        let Some(first_tile) = row_tiles.first() else {
            return;
        };
        assert!(
            row_tiles.len() * TILE_ROWS <= n,
            "more tile rows than outputs"
        );
        let nb = first_tile.blocks();
        for first in (0..nb).step_by(SPAN) {
            let count = SPAN.min(nb - first);
            let at = first * Q8_PACKED_BLOCK_BYTES..(first + count) * Q8_PACKED_BLOCK_BYTES;
            let pairs = groups.chunks_exact(2 * group_bytes);
            for (pair, out) in pairs.zip(out.chunks_exact_mut(2 * n)) {
                let (a, b) = pair.split_at(group_bytes);
                let sa = a[at.clone()].as_chunks::<Q8_PACKED_BLOCK_BYTES>().0;
                let sb = b[at.clone()].as_chunks::<Q8_PACKED_BLOCK_BYTES>().0;
                for (j, (ka, kb)) in sa.iter().zip(sb).enumerate() {
                    let chunk =
                        |c: usize| join(load32(&ka[16 + 32 * c..]), load32(&kb[16 + 32 * c..]));
                    tiles.set_values(j, from_fn(chunk));
                }
                let d: [__m512; SPAN] = std::array::from_fn(|j| match (sa.get(j), sb.get(j)) {
                    (Some(ka), Some(kb)) => f16x16(&ka[..16], &kb[..16]),
                    _ => _mm512_setzero_ps(),
                });
                for (t, rows) in row_tiles.iter().enumerate() {
                    assert_eq!(rows.blocks(), nb, "tiles of one width");
                    tiles.products(rows, first, count, true);
                    let mut acc: [__m512; TILE_ROWS] =
                        std::array::from_fn(|r| so_far(out, n, TILE_ROWS * t + r, first));
                    for (j, &d) in d[..count].iter().enumerate() {
                        block_step(&mut acc, tiles, rows, (j, first + j), d);
                    }
                    for (r, &acc) in acc.iter().enumerate() {
                        store_row(out, n, TILE_ROWS * t + r, acc);
                    }
                }
            }
        }
    }
}
