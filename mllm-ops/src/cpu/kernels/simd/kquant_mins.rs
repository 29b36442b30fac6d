//! The minimums' term `Σ_j m_j·Σ q_x` of the packed Q4_K and Q5_K
//! formula (see `packed_q4k`) for a pair's 16 weight rows, as the AVX-512
//! pair kernels (`vnni_packed_q4k`) and the AMX tile kernels
//! (`amx_kquant`) take it: a row's exact block sums of one super-block in
//! a few words ([`min_sum_words`]), the pair's minimums arranged once per
//! super-block ([`MinWeights`]), and four to six products with embedded
//! broadcasts per row ([`row_mins`]), where a multiply of each block sum
//! by each sub-block's minimums took eight `vpmulld` per row.
//!
//! Every function here is a safe `#[target_feature]` function: callers
//! must only reach it after detecting the AVX-512 level's features (see
//! `QuantKernel`).

use std::arch::asm;
use std::arch::x86_64::*;

use crate::cpu::kernels::packed::GROUP_ROWS;
use crate::cpu::kernels::packed_q4k::SUB_BLOCKS;
use crate::cpu::kernels::qact::{Q16Row, BYTE};

/// A row's exact block sums of one super-block in the words that
/// [`row_mins`] takes. A sum of 16-bit rows is split as `256·high + low`
/// (`|high| ≤ 4097`, `low` in `-128..=127`, so that a `vpdpbusd` can
/// broadcast it as its signed operand): words `0..4` hold the high parts
/// of blocks `2i` and `2i + 1` as two `i16`, words 4 and 5 the low parts
/// of blocks `4k..4k + 4` as four `i8`. A sum of 8-bit rows
/// (`|·| ≤ 32·127`) fits 16 bits: words `0..4` hold the sums themselves,
/// two per word. The other words are unused.
pub(crate) type MinSumWords = [u32; 8];

/// Row `x`'s [`MinSumWords`] for super-block `s`: the eight sums' high
/// parts narrowed to `i16` in one instruction, their low bytes in another.
#[target_feature(enable = "avx2,avx512f,avx512vl")]
#[inline]
pub(crate) fn min_sum_words<const SHIFT: u32>(x: &Q16Row<'_, SHIFT>, s: usize) -> MinSumWords {
    let sums = &x.sums[s * SUB_BLOCKS..][..SUB_BLOCKS];
    // SAFETY: `sums` is eight `i32` (32 bytes, sliced above) and
    // `loadu` has no alignment requirement.
    let sums = unsafe { _mm256_loadu_si256(sums.as_ptr().cast()) };
    // Rounded, so that `sums − 256·high`, the low byte of `sums` read as
    // an `i8`, is the low part.
    let high = if SHIFT == BYTE {
        sums
    } else {
        _mm256_srai_epi32::<8>(_mm256_add_epi32(sums, _mm256_set1_epi32(128)))
    };
    let mut words = [0u32; 8];
    let (pairs, quads) = words.split_at_mut(4);
    // SAFETY: `pairs` is four `u32` (16 bytes) and `quads` holds four
    // (8 bytes are written); the stores have no alignment requirement.
    unsafe {
        _mm_storeu_si128(pairs.as_mut_ptr().cast(), _mm256_cvtepi32_epi16(high));
        if SHIFT != BYTE {
            _mm_storel_epi64(quads.as_mut_ptr().cast(), _mm256_cvtepi32_epi8(sums));
        }
    }
    words
}

/// A pair's minimums of one super-block as [`row_mins`] takes them, per
/// lane (weight row `w`): `pairs[i]` holds `m` of sub-blocks `2i` and
/// `2i + 1` as two `i16`, times 256 for 16-bit rows (`256·63` fits);
/// `bytes[k]` the minimums of sub-blocks `4k..4k + 4` as four bytes
/// (the unsigned operand of `vpdpbusd`: they are below 64).
pub(crate) struct MinWeights {
    pairs: [__m512i; 4],
    bytes: [__m512i; 2],
}

impl MinWeights {
    /// The minimums of a pair's super-blocks `sa` and `sb`, whose first
    /// minimum is at `mins_at` (eight rows' bytes per sub-block, as
    /// `packed_q4k::MINS_AT`).
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    pub(crate) fn new<const SHIFT: u32>(sa: &[u8], sb: &[u8], mins_at: usize) -> Self {
        use super::vnni_packed_q4k::u8x16;
        let m: [__m512i; SUB_BLOCKS] = std::array::from_fn(|j| {
            let at = mins_at + GROUP_ROWS * j;
            u8x16(&sa[at..], &sb[at..])
        });
        let pairs = std::array::from_fn(|i| {
            let pair = _mm512_or_si512(m[2 * i], _mm512_slli_epi32::<16>(m[2 * i + 1]));
            if SHIFT == BYTE {
                pair
            } else {
                _mm512_slli_epi16::<8>(pair)
            }
        });
        let bytes = std::array::from_fn(|k| {
            let (m0, m1) = (m[4 * k], _mm512_slli_epi32::<8>(m[4 * k + 1]));
            let (m2, m3) = (
                _mm512_slli_epi32::<16>(m[4 * k + 2]),
                _mm512_slli_epi32::<24>(m[4 * k + 3]),
            );
            _mm512_or_si512(_mm512_or_si512(m0, m1), _mm512_or_si512(m2, m3))
        });
        MinWeights { pairs, bytes }
    }
}

/// A row's `Σ_j m_j·Σ q_x` for the 16 weight rows of a pair: its
/// [`MinSumWords`] against the pair's [`MinWeights`], exact (below 2^30).
/// For 16-bit rows `Σ 256·m·high` in four `vpdpwssd` and `Σ m·low` in
/// two `vpdpbusd`; for 8-bit rows the sums in the first four. Each takes
/// its word as an embedded broadcast, one instruction where a broadcast
/// and a product were two: in the AMX Q4_K tile kernel the float step of
/// every row, of every tile, super-block and pair, is a third of the
/// samples, and its instructions set the pace.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
pub(crate) fn row_mins<const SHIFT: u32>(mins: &MinWeights, words: &MinSumWords) -> __m512i {
    let [p0, p1, p2, p3] = mins.pairs;
    let mut acc = _mm512_setzero_si512();
    // SAFETY: the instructions read the words `0..4` of `words` (16
    // bytes; no alignment needed) and write only `acc`; the enclosing
    // function requires AVX-512F and AVX-512 VNNI, which `vpdpwssd` on
    // 512-bit registers needs.
    unsafe {
        asm!(
            "vpdpwssd {acc}, {p0}, dword ptr [{w}]{{1to16}}",
            "vpdpwssd {acc}, {p1}, dword ptr [{w} + 4]{{1to16}}",
            "vpdpwssd {acc}, {p2}, dword ptr [{w} + 8]{{1to16}}",
            "vpdpwssd {acc}, {p3}, dword ptr [{w} + 12]{{1to16}}",
            acc = inout(zmm_reg) acc,
            p0 = in(zmm_reg) p0,
            p1 = in(zmm_reg) p1,
            p2 = in(zmm_reg) p2,
            p3 = in(zmm_reg) p3,
            w = in(reg) words.as_ptr(),
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    if SHIFT == BYTE {
        return acc;
    }
    let [b0, b1] = mins.bytes;
    // SAFETY: as above, for words 4 and 5 (bytes 16 to 24 of `words`);
    // the minimums are the unsigned operand, the words' `i8` low parts
    // the signed one.
    unsafe {
        asm!(
            "vpdpbusd {acc}, {b0}, dword ptr [{w} + 16]{{1to16}}",
            "vpdpbusd {acc}, {b1}, dword ptr [{w} + 20]{{1to16}}",
            acc = inout(zmm_reg) acc,
            b0 = in(zmm_reg) b0,
            b1 = in(zmm_reg) b1,
            w = in(reg) words.as_ptr(),
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    acc
}
