//! AVX-512 VNNI product of a packed Q4 row group (see `packed`) with one to
//! four 16-bit activation rows, on 256-bit vectors (AVX-512VL), and of
//! two consecutive groups at once on 512-bit vectors (`pair_dot`: the
//! 256-bit work in each half, so the same bits).
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
use super::avx2_packed::BlockPlanes;
use crate::cpu::kernels::packed::{GROUP_ROWS, PACKED_BLOCK_BYTES, TILE_TOKENS};
use crate::cpu::kernels::qact::{Q16Row, BLOCK, BYTE, WIDE};

super::avx2_packed::scaled_block_tile!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    PACKED_BLOCK_BYTES,
    block_sums
);

/// `avx2_packed::block_sums` with `dpbusd`: the same 32-bit sums.
///
/// `nibble_block_sums!()` defines it in the calling module: each packed
/// format's kernels get their own copy, so that each instance has one
/// caller, its tile, and is inlined into it. Without arguments it uses
/// AVX-512VL's `dpbusd`; `nibble_block_sums!(features, dpbusd)` names the
/// target features and the 256-bit `dpbusd` intrinsic (AVX-VNNI's).
macro_rules! nibble_block_sums {
    () => {
        $crate::cpu::kernels::simd::vnni_packed::nibble_block_sums!(
            "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
            _mm256_dpbusd_epi32
        );
    };
    ($features:literal, $dpbusd:path) => {
        #[target_feature(enable = $features)]
        #[inline]
        fn block_sums<const T: usize, const SHIFT: u32>(
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
                let plane = |sum: __m256i, x: &[i8; BLOCK]| {
                    let sum = $dpbusd(sum, w_lo, word(x, 4 * j));
                    $dpbusd(sum, w_hi, word(x, 16 + 4 * j))
                };
                for t in 0..T {
                    sum_hi[t] = plane(sum_hi[t], x.his[t]);
                    if BlockPlanes::<T, SHIFT>::HAS_LO {
                        sum_lo[t] = plane(sum_lo[t], x.los[t]);
                    }
                }
            }
            (sum_hi, sum_lo)
        }
    };
}

pub(crate) use nibble_block_sums;

nibble_block_sums!();

super::avx2_packed::packed_group_dot!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    [const SHIFT: u32],
    Q16Row<'_, SHIFT>
);

/// Two 256-bit halves as one 512-bit vector, `lo` in the low half.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Eight f16 values at the start of `a` and eight at the start of `b` as
/// sixteen f32.
#[target_feature(enable = "avx512f,avx512vl")]
#[inline]
pub(crate) fn f16x16(a: &[u8], b: &[u8]) -> __m512 {
    let (a, b) = (&a[..16], &b[..16]);
    // SAFETY: `a` and `b` hold 16 bytes each (sliced above) and `loadu`
    // has no alignment requirement.
    let (a, b) = unsafe {
        (
            _mm_loadu_si128(a.as_ptr().cast()),
            _mm_loadu_si128(b.as_ptr().cast()),
        )
    };
    _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), b))
}

/// The 4-byte word at `at` of a 32-byte activation block in every lane of
/// a 512-bit vector, in a kernel of `T` activation rows. With one row the
/// broadcast load is written out (see [`dpbusd_words`]).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn word16<const T: usize>(x: &[i8; BLOCK], at: usize) -> __m512i {
    if T > 1 {
        let w = [x[at], x[at + 1], x[at + 2], x[at + 3]].map(|b| b as u8);
        return _mm512_set1_epi32(i32::from_le_bytes(w));
    }
    let word = &x[at..at + 4];
    let out: __m512i;
    // SAFETY: the instruction reads the 4 bytes of `word` (sliced above,
    // no alignment needed) and writes only `out`; the enclosing function
    // requires AVX-512F, which a broadcast into a 512-bit register needs.
    unsafe {
        std::arch::asm!(
            "vpbroadcastd {out}, dword ptr [{p}]",
            out = out(zmm_reg) out,
            p = in(reg) word.as_ptr(),
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    out
}

/// `acc` plus the products of `ws[c]` with the 4-byte word at
/// `FIRST + 4·c` of activation block `x` (the word in every lane), in a
/// kernel of `T` activation rows. `written_out` (always with one row, in
/// decode) makes the four `vpdpbusd` read their words themselves, as
/// embedded broadcasts at the block's address plus constant offsets: the
/// compiler would load such words into general registers and broadcast
/// them from there (an extra vector instruction per product, which cost
/// the one-row loops a third of their speed), and compute each address
/// with an integer instruction of its own (5 % of the Q4_1 one-row loop).
/// With more rows the compiler folds most broadcasts itself, with
/// addresses the written-out form would need registers for (with three or
/// four rows, spills); the Q5_0 and Q5_1 tiles still write out their first
/// row's products (see `vnni_packed_q5`).
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
pub(crate) fn dpbusd_words<const T: usize, const FIRST: usize>(
    acc: __m512i,
    ws: [__m512i; 4],
    x: &[i8; BLOCK],
    written_out: bool,
) -> __m512i {
    const { assert!(FIRST + 16 <= BLOCK, "the four words lie inside the block") };
    if !written_out {
        return ws.iter().enumerate().fold(acc, |acc, (c, &w)| {
            _mm512_dpbusd_epi32(acc, w, word16::<T>(x, FIRST + 4 * c))
        });
    }
    let mut acc = acc;
    // SAFETY: the instructions read the 16 bytes at offsets `FIRST` to
    // `FIRST + 16` of `x`, inside its `BLOCK` bytes (asserted above at
    // compile time; no alignment needed), and write only `acc`; the
    // enclosing function requires AVX-512F and AVX-512 VNNI, which
    // `vpdpbusd` on 512-bit registers needs.
    unsafe {
        std::arch::asm!(
            "vpdpbusd {acc}, {w0}, dword ptr [{p} + {at0}]{{1to16}}",
            "vpdpbusd {acc}, {w1}, dword ptr [{p} + {at1}]{{1to16}}",
            "vpdpbusd {acc}, {w2}, dword ptr [{p} + {at2}]{{1to16}}",
            "vpdpbusd {acc}, {w3}, dword ptr [{p} + {at3}]{{1to16}}",
            acc = inout(zmm_reg) acc,
            w0 = in(zmm_reg) ws[0],
            w1 = in(zmm_reg) ws[1],
            w2 = in(zmm_reg) ws[2],
            w3 = in(zmm_reg) ws[3],
            p = in(reg) x.as_ptr(),
            at0 = const FIRST,
            at1 = const FIRST + 4,
            at2 = const FIRST + 8,
            at3 = const FIRST + 12,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    acc
}

/// `_mm512_dpbusd_epi32(acc, w, word16::<T>(x, at))` in a kernel of `T`
/// activation rows, one word at a time, with one row written out as in
/// [`dpbusd_words`] (but with the word's address in a register). The
/// packed Q8_0 tile takes it (its one-row loop ran 2-4 % slower with its
/// high plane's products four words at a time), and so do the packed Q6_K
/// tile (the same speed either way) and the packed Q4 tiles of several
/// rows, chunk by chunk.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
pub(crate) fn dpbusd_word<const T: usize>(
    acc: __m512i,
    w: __m512i,
    x: &[i8; BLOCK],
    at: usize,
) -> __m512i {
    if T > 1 {
        return _mm512_dpbusd_epi32(acc, w, word16::<T>(x, at));
    }
    let word = &x[at..at + 4];
    let mut acc = acc;
    // SAFETY: the instruction reads the 4 bytes of `word` (sliced above,
    // no alignment needed) and writes only `acc`; the enclosing function
    // requires AVX-512F and AVX-512 VNNI, which `vpdpbusd` on 512-bit
    // registers needs.
    unsafe {
        std::arch::asm!(
            "vpdpbusd {acc}, {w}, dword ptr [{p}]{{1to16}}",
            acc = inout(zmm_reg) acc,
            w = in(zmm_reg) w,
            p = in(reg) word.as_ptr(),
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    acc
}

/// Defines `pair_tile::<T>`, the outputs of two consecutive packed groups
/// `a` and `b` for `T` 16-bit activation rows at once on 512-bit vectors
/// (lanes 0..8 of each result are `a`'s eight rows, lanes 8..16 `b`'s),
/// for a layout of `$block_bytes` per block that starts with the eight
/// rows' f16 scales and offsets (as `scaled_block_tile`) and the block
/// sums `$pair_sums` of two groups' bits (as [`pair_block_sums`]). Lane by
/// lane the integer and float steps of `scaled_block_tile`, so the same
/// bits; the packed Q4 and Q5 kernels share it.
macro_rules! scaled_block_pair_tile {
    ($block_bytes:expr, $pair_sums:path) => {
        /// The outputs of groups `a` and `b` for `T` activation rows.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        #[inline]
        fn pair_tile<const T: usize, const SHIFT: u32>(
            a: &[u8],
            b: &[u8],
            xs: &[Q16Row<'_, SHIFT>],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) -> [__m512; T] {
            use $crate::cpu::kernels::packed::NIBBLES_AT;
            use $crate::cpu::kernels::simd::avx2_packed::{ByteConsts, RowPlanes};
            use $crate::cpu::kernels::simd::prefetch::block_into_l1;
            use $crate::cpu::kernels::simd::vnni_packed::{f16x16, pair_add_block};
            let xs: [Q16Row<'_, SHIFT>; T] = std::array::from_fn(|t| xs[t]);
            let nb = xs[0].d.len();
            let planes = RowPlanes::new(xs, nb, ByteConsts::new());
            let mut acc = [_mm512_setzero_ps(); T];
            let blocks_a = a[..nb * $block_bytes].as_chunks::<{ $block_bytes }>().0;
            let blocks_b = b[..nb * $block_bytes].as_chunks::<{ $block_bytes }>().0;
            let mut ahead = $crate::cpu::kernels::simd::prefetch::Streams::new(a, 2, reads);
            for (i, (ka, kb)) in blocks_a.iter().zip(blocks_b).enumerate() {
                ahead.next($block_bytes);
                block_into_l1(ka, $block_bytes);
                block_into_l1(kb, $block_bytes);
                let (sum_hi, sum_lo) =
                    $pair_sums(&ka[NIBBLES_AT..], &kb[NIBBLES_AT..], planes.block(i));
                let d = f16x16(&ka[..16], &kb[..16]);
                let m = f16x16(&ka[16..32], &kb[16..32]);
                let x = planes.scales(i);
                for t in 0..T {
                    acc[t] = pair_add_block::<SHIFT>(acc[t], (d, m), sum_hi[t], sum_lo[t], x[t]);
                }
            }
            acc
        }
    };
}

pub(crate) use scaled_block_pair_tile;

scaled_block_pair_tile!(PACKED_BLOCK_BYTES, pair_block_sums);

/// `block_sums` of two groups' blocks at once (`a`'s nibbles in the low
/// halves, `b`'s in the high ones). (The packed Q4_K kernel takes its
/// sums its own way, see `vnni_packed_q4k::pair_scaled_sums`.)
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn pair_block_sums<const T: usize, const SHIFT: u32>(
    a: &[u8],
    b: &[u8],
    x: BlockPlanes<'_, T, SHIFT>,
) -> ([__m512i; T], [__m512i; T]) {
    let nibble = _mm512_set1_epi8(0x0F);
    let mut sum_hi = [_mm512_setzero_si512(); T];
    let mut sum_lo = [_mm512_setzero_si512(); T];
    if T > 1 {
        // Chunk by chunk, each row's sums taking its products.
        for j in 0..4 {
            let v = join(load32(&a[32 * j..]), load32(&b[32 * j..]));
            let w_lo = _mm512_and_si512(v, nibble);
            let w_hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
            for t in 0..T {
                let h = x.his[t];
                sum_hi[t] = dpbusd_word::<T>(sum_hi[t], w_lo, h, 4 * j);
                sum_hi[t] = dpbusd_word::<T>(sum_hi[t], w_hi, h, 16 + 4 * j);
                if BlockPlanes::<T, SHIFT>::HAS_LO {
                    let l = x.los[t];
                    sum_lo[t] = dpbusd_word::<T>(sum_lo[t], w_lo, l, 4 * j);
                    sum_lo[t] = dpbusd_word::<T>(sum_lo[t], w_hi, l, 16 + 4 * j);
                }
            }
        }
        return (sum_hi, sum_lo);
    }
    // One row (decode): four written-out products per plane and nibble
    // half, and the high nibbles kept in place, 16 times their values
    // (whose products still fit `dpbusd`'s exact 32-bit sums), so that
    // each plane's sum takes one shift instead of each chunk. With more
    // rows each row's sums would take shifts of their own, and the chunks
    // as above ran faster.
    let v: [__m512i; 4] = std::array::from_fn(|j| join(load32(&a[32 * j..]), load32(&b[32 * j..])));
    let w_lo = v.map(|v| _mm512_and_si512(v, nibble));
    let w_hi16 = v.map(|v| _mm512_andnot_si512(nibble, v));
    let plane = |x: &[i8; BLOCK]| {
        let zero = _mm512_setzero_si512();
        let low = dpbusd_words::<T, 0>(zero, w_lo, x, true);
        let high16 = dpbusd_words::<T, 16>(zero, w_hi16, x, true);
        _mm512_add_epi32(low, _mm512_srai_epi32::<4>(high16))
    };
    sum_hi[0] = plane(x.his[0]);
    if BlockPlanes::<T, SHIFT>::HAS_LO {
        sum_lo[0] = plane(x.los[0]);
    }
    (sum_hi, sum_lo)
}

/// `avx2_packed::add_block` for sixteen rows (two groups) at once.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn pair_add_block<const SHIFT: u32>(
    acc: __m512,
    (d, m): (__m512, __m512),
    hi: __m512i,
    lo: __m512i,
    (dx, sx): (f32, f32),
) -> __m512 {
    let s = pair_combine::<SHIFT>(hi, lo);
    let scale = _mm512_mul_ps(d, _mm512_set1_ps(dx));
    let sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc);
    _mm512_fmadd_ps(m, _mm512_set1_ps(sx), sum)
}

/// `avx2_packed::combine` on 512-bit vectors.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn pair_combine<const SHIFT: u32>(hi: __m512i, lo: __m512i) -> __m512i {
    debug_assert!(SHIFT == WIDE || SHIFT == BYTE);
    if SHIFT == BYTE {
        hi
    } else {
        _mm512_add_epi32(_mm512_slli_epi32::<8>(hi), lo)
    }
}

/// Stores the two groups' halves of `acc` (see `pair_tile`): `out[t]` for
/// the first group, `out[T + t]` for the second.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn store_pair(acc: &[__m512], out: &mut [[f32; GROUP_ROWS]]) {
    let t = acc.len();
    for (i, a) in acc.iter().enumerate() {
        let lo = _mm512_castps512_ps256(*a);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a)));
        store(&mut out[i], lo);
        store(&mut out[t + i], hi);
    }
}

/// Defines `pair_dot` (the product of two consecutive packed groups `a`
/// and `b` with one to `TILE_TOKENS` activation rows of type `$input`:
/// `out[t]` for `a`, `out[xs.len() + t]` for `b`) over a module's
/// `pair_tile::<T>`; the packed Q4 and Q8_0 kernels share it. With `wide`
/// after the input type it takes up to `WIDE_TILE_TOKENS` rows.
macro_rules! packed_pair_dot {
    ([$($generics:tt)*], $input:ty) => {
        $crate::cpu::kernels::simd::vnni_packed::packed_pair_dot!(
            [$($generics)*], $input, TILE_TOKENS, [1, 2, 3], 4
        );
    };
    ([$($generics:tt)*], $input:ty, wide) => {
        // The arms below name every row count up to the widest tile.
        const _: () = assert!($crate::cpu::kernels::packed::WIDE_TILE_TOKENS == 8);
        $crate::cpu::kernels::simd::vnni_packed::packed_pair_dot!(
            [$($generics)*],
            $input,
            $crate::cpu::kernels::packed::WIDE_TILE_TOKENS,
            [1, 2, 3, 4, 5, 6, 7],
            8
        );
    };
    ([$($generics:tt)*], $input:ty, $most:expr, [$($t:literal),*], $last:literal) => {
        /// The two-group product for one to `$most` activation rows.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        pub(crate) fn pair_dot<$($generics)*>(
            a: &[u8],
            b: &[u8],
            xs: &[$input],
            out: &mut [[f32; GROUP_ROWS]],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) {
            // A format whose tile of rows outgrew this kernel would get
            // only `$last` rows' outputs: stop it here.
            assert!(xs.len() <= $most, "more rows than the pair kernel takes");
            debug_assert!(out.len() >= 2 * xs.len());
            // The tile size is the annotated array length.
            match xs.len() {
                0 => {}
                $($t => store_pair(&{ let acc: [__m512; $t] = pair_tile(a, b, xs, reads); acc }, out),)*
                _ => store_pair(&{ let acc: [__m512; $last] = pair_tile(a, b, xs, reads); acc }, out),
            }
        }
    };
}

pub(crate) use packed_pair_dot;

packed_pair_dot!([const SHIFT: u32], Q16Row<'_, SHIFT>);
