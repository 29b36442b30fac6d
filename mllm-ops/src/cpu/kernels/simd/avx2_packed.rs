//! AVX2 product of a packed Q4 row group (see `packed`) with one to four
//! 16-bit activation rows (or 8-bit ones, `qact::BYTE`: the low plane's
//! products are then skipped).
//!
//! Per block, each 32-byte chunk splits into two registers of nibbles (four
//! consecutive columns of each of the eight rows); `maddubs` with a
//! broadcast 4-byte word of an activation plane gives two 16-bit partial
//! sums per row, and the eight chunks' sums of a block add up in 16 bits
//! without overflow (`16 · 15 · 127 < 2¹⁵`). One `madd` per plane then
//! leaves each row's 32-bit block sum in its own lane.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use crate::cpu::kernels::packed::{GROUP_ROWS, PACKED_BLOCK_BYTES, TILE_TOKENS};
use crate::cpu::kernels::qact::{Q16Row, BLOCK, BYTE, WIDE};

/// Eight f16 values at the start of `b` as f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn f16x8(b: &[u8]) -> __m256 {
    let b = &b[..16];
    // SAFETY: `b` holds 16 bytes (sliced above) and `loadu` has no
    // alignment requirement.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(b.as_ptr().cast()) })
}

/// The 4-byte word at `at` of a 32-byte activation block in every lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn word(x: &[i8; BLOCK], at: usize) -> __m256i {
    let w = [x[at], x[at + 1], x[at + 2], x[at + 3]].map(|b| b as u8);
    _mm256_set1_epi32(i32::from_le_bytes(w))
}

/// Defines `tile::<T, SHIFT>`, the eight outputs of one packed group for
/// `T` activation rows split at `SHIFT` ([`WIDE`] or [`BYTE`]), for a
/// layout of `$block_bytes` per block of 32 columns that starts with the
/// eight rows' f16 scales `d` and offsets `m` (see [`block_scales`])
/// followed by the block's bits: `$sums(bits, planes)` gives the block's
/// 32-bit plane sums (as [`block_sums`] does) and [`add_block`] the float
/// step. The packed Q4 and Q5 kernels of every instruction set share it.
macro_rules! scaled_block_tile {
    ($features:literal, $block_bytes:expr, $sums:path) => {
        /// The eight outputs of one packed group for `T` activation rows.
        #[target_feature(enable = $features)]
        #[inline]
        fn tile<const T: usize, const SHIFT: u32>(
            group: &[u8],
            xs: &[Q16Row<'_, SHIFT>],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) -> [__m256; T] {
            use $crate::cpu::kernels::packed::NIBBLES_AT;
            use $crate::cpu::kernels::simd::avx2_packed::{
                add_block, block_scales, ByteConsts, RowPlanes,
            };
            let xs: [Q16Row<'_, SHIFT>; T] = std::array::from_fn(|t| xs[t]);
            let nb = xs[0].d.len();
            let planes = RowPlanes::new(xs, nb, ByteConsts::new());
            let mut acc = [_mm256_setzero_ps(); T];
            let blocks = group[..nb * $block_bytes].as_chunks::<{ $block_bytes }>().0;
            let mut ahead = $crate::cpu::kernels::simd::prefetch::Streams::new(group, 1, reads);
            for (i, blk) in blocks.iter().enumerate() {
                ahead.next($block_bytes);
                $crate::cpu::kernels::simd::prefetch::block_into_l1(blk, $block_bytes);
                let (sum_hi, sum_lo) = $sums(&blk[NIBBLES_AT..], planes.block(i));
                let scales = block_scales(blk);
                let x = planes.scales(i);
                for t in 0..T {
                    acc[t] = add_block::<SHIFT>(acc[t], scales, sum_hi[t], sum_lo[t], x[t]);
                }
            }
            acc
        }
    };
}

pub(crate) use scaled_block_tile;

scaled_block_tile!("avx2,fma,f16c", PACKED_BLOCK_BYTES, block_sums);

/// The byte constants of the packed block sums, made once per tile.
///
/// A vector constant the compiler can see is reloaded from the binary's
/// read-only data wherever registers run short, which in a tile's loop is
/// a load from one fixed address per pass. When one of the loop's
/// register spills lands on a stack slot whose address has the same low
/// 12 bits (4 KiB aliasing), the core takes that load as depending on
/// the spill's store, and the loop stalls on every pass: one thread's
/// 16-bit Q4_1 prefill of a 1536 x 576 layer ran at 26-37 GMAC/s instead
/// of 46-47 for 8 of 128 stack positions 32 bytes apart (a Zen 3; where
/// a worker's stack sits depends on its callers' frames). Hidden from the
/// optimizer with `black_box`, the constants live in registers or in
/// slots of the kernel's own frame, which alias nothing else in it.
#[derive(Clone, Copy)]
pub(crate) struct ByteConsts {
    /// `0x0F` in every byte: the low nibble.
    pub low4: __m256i,
    /// `0x10` in every byte: Q5's fifth bit.
    pub bit4: __m256i,
    /// `1` in every 16-bit lane: `madd` with it widens pair sums.
    pub ones: __m256i,
    /// `256` in every 16-bit lane: `madd` with it widens the high plane's
    /// pair sums of [`WIDE`] rows and weights them in the same step.
    pub wide_hi: __m256i,
    /// The shuffle of `avx2_packed_q4k::scale_pairs`: 32-bit lane `r`
    /// takes byte `r` of the eight bytes (held in both 128-bit halves)
    /// twice, as 16-bit integers (`-1` leaves a zero byte).
    pub scale_lanes: __m256i,
}

impl ByteConsts {
    /// The constants, opaque to the optimizer.
    #[target_feature(enable = "avx2")]
    pub(crate) fn new() -> Self {
        std::hint::black_box(ByteConsts {
            low4: _mm256_set1_epi8(0x0F),
            bit4: _mm256_set1_epi8(0x10),
            ones: _mm256_set1_epi16(1),
            wide_hi: _mm256_set1_epi16(1 << WIDE),
            scale_lanes: _mm256_setr_epi8(
                0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1, //
                4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1,
            ),
        })
    }
}

/// The activation planes and block scales of `T` rows split at `SHIFT`,
/// block by block, with the tile's [`ByteConsts`].
///
/// Every row is cut to the same `nb` blocks when the planes are made, so
/// that reading block `i` of all rows takes one bounds check, not one per
/// row and part: in the AVX-512 pair kernels with eight rows the checks
/// were 24 compares and branches per block (the Q5_0 and Q4_1 kernels ran
/// 5-17 % faster without them).
pub(crate) struct RowPlanes<'a, const T: usize, const SHIFT: u32> {
    his: [&'a [[i8; BLOCK]]; T],
    los: [&'a [[i8; BLOCK]]; T],
    d: [&'a [f32]; T],
    s: [&'a [f32]; T],
    nb: usize,
    consts: ByteConsts,
}

/// A block of zeros, where [`RowPlanes::block`] starts its rows' blocks.
static ZERO_BLOCK: [i8; BLOCK] = [0; BLOCK];

impl<'a, const T: usize, const SHIFT: u32> RowPlanes<'a, T, SHIFT> {
    /// The first `nb` blocks of the rows `xs`, with the tile's constants
    /// (made by the tile itself: a function with target features here
    /// would keep its closures out of line, a cost on every tile).
    ///
    /// # Panics
    ///
    /// If a row has fewer than `nb` blocks.
    #[inline]
    pub(crate) fn new(xs: [Q16Row<'a, SHIFT>; T], nb: usize, consts: ByteConsts) -> Self {
        RowPlanes {
            his: xs.map(|x| &x.hi.as_chunks::<BLOCK>().0[..nb]),
            los: xs.map(|x| &x.lo.as_chunks::<BLOCK>().0[..nb]),
            d: xs.map(|x| &x.d[..nb]),
            s: xs.map(|x| &x.s[..nb]),
            nb,
            consts,
        }
    }

    /// Block `i` of every row: a loop, where `array::map` over eight rows
    /// stayed out of line (two calls per block in the AVX-512 Q5_0 and
    /// Q4_K pair kernels with eight 8-bit rows; SmolLM2 Q4_K_M's 8-bit
    /// prefill at that level rose 6 % without them).
    ///
    /// # Panics
    ///
    /// If `i` is not below the `nb` the planes were made with.
    #[inline]
    pub(crate) fn block(&self, i: usize) -> BlockPlanes<'a, T, SHIFT> {
        assert!(i < self.nb, "a block past the planes");
        let mut his = [&ZERO_BLOCK; T];
        let mut los = [&ZERO_BLOCK; T];
        for t in 0..T {
            // SAFETY: every row's planes hold `nb` blocks (cut in `new`)
            // and `i < nb` (asserted above).
            his[t] = unsafe { self.his[t].get_unchecked(i) };
            if BlockPlanes::<T, SHIFT>::HAS_LO {
                // SAFETY: as above.
                los[t] = unsafe { self.los[t].get_unchecked(i) };
            }
        }
        BlockPlanes {
            his,
            los,
            consts: self.consts,
        }
    }

    /// Every row's scale `d` and `d · Σq` of block `i`.
    ///
    /// # Panics
    ///
    /// If `i` is not below the `nb` the planes were made with.
    #[inline]
    pub(crate) fn scales(&self, i: usize) -> [(f32, f32); T] {
        assert!(i < self.nb, "a block past the planes");
        let mut out = [(0.0, 0.0); T];
        for (t, out) in out.iter_mut().enumerate() {
            // SAFETY: every row's scales hold `nb` values (cut in `new`)
            // and `i < nb` (asserted above).
            *out = unsafe { (*self.d[t].get_unchecked(i), *self.s[t].get_unchecked(i)) };
        }
        out
    }
}

/// One block of 32 values of `T` activation rows split at `SHIFT`. Its type
/// gives each block-sum function one instance per split (each then
/// inlined into its one tile).
#[derive(Clone, Copy)]
pub(crate) struct BlockPlanes<'a, const T: usize, const SHIFT: u32> {
    /// The high planes.
    pub his: [&'a [i8; BLOCK]; T],
    /// The low planes (all zero for [`BYTE`] rows).
    pub los: [&'a [i8; BLOCK]; T],
    /// The tile's constants.
    pub consts: ByteConsts,
}

impl<'a, const T: usize, const SHIFT: u32> BlockPlanes<'a, T, SHIFT> {
    /// Whether the low planes count: not for [`BYTE`] rows, whose block
    /// sums skip them.
    pub(crate) const HAS_LO: bool = SHIFT != BYTE;
}

/// The eight rows' 32-bit sums of one block of 32 columns over the high
/// and the low activation planes of `T` rows (the low sums stay zero for
/// [`BYTE`] rows), from the block's 128 bytes of nibbles in the packed
/// chunk layout.
///
/// `nibble_block_sums!()` defines it in the calling module: each packed
/// format's kernels get their own copy, so that each instance has one
/// caller, its tile, and is inlined into it.
macro_rules! nibble_block_sums {
    () => {
        $crate::cpu::kernels::simd::avx2_packed::nibble_block_sums!(sixteen);

        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        fn block_sums<const T: usize, const SHIFT: u32>(
            nibbles: &[u8],
            x: $crate::cpu::kernels::simd::avx2_packed::BlockPlanes<'_, T, SHIFT>,
        ) -> ([__m256i; T], [__m256i; T]) {
            let ones = x.consts.ones;
            let (sum_hi, sum_lo) = block_sums16(nibbles, x);
            (
                sum_hi.map(|s| _mm256_madd_epi16(s, ones)),
                sum_lo.map(|s| _mm256_madd_epi16(s, ones)),
            )
        }
    };
    // `block_sums16` alone: the sums as the 16-bit pair sums of each row
    // before `madd` widens them.
    (sixteen) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        fn block_sums16<const T: usize, const SHIFT: u32>(
            nibbles: &[u8],
            x: $crate::cpu::kernels::simd::avx2_packed::BlockPlanes<'_, T, SHIFT>,
        ) -> ([__m256i; T], [__m256i; T]) {
            use $crate::cpu::kernels::qact::BLOCK;
            use $crate::cpu::kernels::simd::avx2_i8::load32;
            use $crate::cpu::kernels::simd::avx2_packed::{split_nibbles, word, BlockPlanes};
            let mut sum_hi = [_mm256_setzero_si256(); T];
            let mut sum_lo = [_mm256_setzero_si256(); T];
            for j in 0..4 {
                let (w_lo, w_hi) = split_nibbles(load32(&nibbles[32 * j..]), x.consts.low4);
                let plane = |x: &[i8; BLOCK]| {
                    _mm256_add_epi16(
                        _mm256_maddubs_epi16(w_lo, word(x, 4 * j)),
                        _mm256_maddubs_epi16(w_hi, word(x, 16 + 4 * j)),
                    )
                };
                for t in 0..T {
                    sum_hi[t] = _mm256_add_epi16(sum_hi[t], plane(x.his[t]));
                    if BlockPlanes::<T, SHIFT>::HAS_LO {
                        sum_lo[t] = _mm256_add_epi16(sum_lo[t], plane(x.los[t]));
                    }
                }
            }
            (sum_hi, sum_lo)
        }
    };
}

pub(crate) use nibble_block_sums;

nibble_block_sums!();

/// The low and the high nibbles of the 32 bytes `v` as bytes (`low4`
/// is [`ByteConsts::low4`]): in the packed chunk layout, four columns of
/// the eight rows and the four columns 16 further on.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn split_nibbles(v: __m256i, nibble: __m256i) -> (__m256i, __m256i) {
    (
        _mm256_and_si256(v, nibble),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble),
    )
}

/// The eight rows' f16 scales `d` and offsets `m` (zero for Q4_0) at the
/// start of a packed Q4 or Q5 block, as f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn block_scales(blk: &[u8]) -> (__m256, __m256) {
    (f16x8(&blk[..16]), f16x8(&blk[16..32]))
}

/// `acc` plus a block's contribution to the eight rows, from its 32-bit
/// sums over the high and low activation planes: `(256·hi + lo) · d·dx +
/// m·sx` (`hi · d·dx + m·sx` for [`BYTE`] rows) with the block's scales
/// `(d, m)` and the activation block's scale `dx` and sum term `sx`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn add_block<const SHIFT: u32>(
    acc: __m256,
    (d, m): (__m256, __m256),
    hi: __m256i,
    lo: __m256i,
    x: (f32, f32),
) -> __m256 {
    add_block_sum(acc, (d, m), combine::<SHIFT>(hi, lo), x)
}

/// [`add_block`] from a block's combined sums `s` (`256·hi + lo`, or `hi`
/// for [`BYTE`] rows).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn add_block_sum(
    acc: __m256,
    (d, m): (__m256, __m256),
    s: __m256i,
    (dx, sx): (f32, f32),
) -> __m256 {
    let scale = _mm256_mul_ps(d, _mm256_set1_ps(dx));
    let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc);
    _mm256_fmadd_ps(m, _mm256_set1_ps(sx), acc)
}

/// The 32-bit block sums `256·hi + lo` of rows split at `SHIFT`
/// ([`WIDE`]), or `hi` alone for [`BYTE`] rows.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn combine<const SHIFT: u32>(hi: __m256i, lo: __m256i) -> __m256i {
    debug_assert!(SHIFT == WIDE || SHIFT == BYTE);
    if SHIFT == BYTE {
        hi
    } else {
        _mm256_add_epi32(_mm256_slli_epi32::<8>(hi), lo)
    }
}

/// Defines `group_dot` (the product of one packed group with one to
/// [`TILE_TOKENS`] activation rows of type `$input`, generic over
/// `$generics`) over a module's `tile::<T, ..>`; the packed Q4, Q6_K and
/// Q8_0 kernels share it.
macro_rules! packed_group_dot {
    ($features:literal, [$($generics:tt)*], $input:ty) => {
        /// The packed group product for one to `TILE_TOKENS` activation rows.
        #[target_feature(enable = $features)]
        pub(crate) fn group_dot<$($generics)*>(
            group: &[u8],
            xs: &[$input],
            out: &mut [[f32; GROUP_ROWS]],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) {
            debug_assert!(xs.len() <= TILE_TOKENS && out.len() >= xs.len());
            let mut store_all = |acc: &[__m256]| {
                for (o, a) in out.iter_mut().zip(acc) {
                    store(o, *a);
                }
            };
            // The tile size is the annotated array length.
            match xs.len() {
                0 => {}
                1 => store_all(&{ let acc: [__m256; 1] = tile(group, xs, reads); acc }),
                2 => store_all(&{ let acc: [__m256; 2] = tile(group, xs, reads); acc }),
                3 => store_all(&{ let acc: [__m256; 3] = tile(group, xs, reads); acc }),
                _ => store_all(&{ let acc: [__m256; 4] = tile(group, xs, reads); acc }),
            }
        }
    };
}

pub(crate) use packed_group_dot;

packed_group_dot!("avx2,fma,f16c", [const SHIFT: u32], Q16Row<'_, SHIFT>);
