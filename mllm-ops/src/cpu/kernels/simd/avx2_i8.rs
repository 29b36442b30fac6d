//! AVX2 integer dot products of Q8_0, Q4_0 and Q4_1 weight rows with 8-bit
//! activations: `maddubs` (unsigned × signed bytes to 16-bit pair sums) and
//! `madd` (to 32-bit), one weight block of 32 per 256-bit vector.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2 and FMA (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::hsum;
use crate::cpu::kernels::qact::{
    q16_max, q16_scale, BlockScales, Int8Type, Q16Row, Q8Row, BLOCK, WIDE,
};
use crate::quant::{q4_0, q4_1, q8_0};

/// The first 32 bytes of `b`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn load32(b: &[u8]) -> __m256i {
    let b = &b[..32];
    // SAFETY: `b` holds 32 bytes (sliced above) and `loadu` has no
    // alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// The 32 nibbles of the first 16 bytes of `b` in Q4 value order: low
/// nibbles of bytes 0..16, then their high nibbles.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn nibbles(b: &[u8]) -> __m256i {
    let b = &b[..16];
    // SAFETY: `b` holds 16 bytes (sliced above) and `loadu` has no
    // alignment requirement.
    let raw = unsafe { _mm_loadu_si128(b.as_ptr().cast()) };
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(raw), raw);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Eight 32-bit sums of four products of unsigned bytes `a` with signed
/// bytes `b` (the pair sums cannot saturate: `|a| ≤ 128`, `|b| ≤ 127`).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn madd_u8_i8(a: __m256i, b: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
}

/// As [`madd_u8_i8`] for two signed operands: `|a| · (b with a's sign)`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn madd_i8_i8(a: __m256i, b: __m256i) -> __m256i {
    madd_u8_i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a))
}

/// The integer-path dot product of a weight row with an activation row
/// (see `qact::dot_i8` for the definition).
#[target_feature(enable = "avx2,fma")]
pub(crate) fn dot_i8(it: Int8Type, w: &[u8], x: Q8Row<'_>) -> f32 {
    let xq: &[u8] = bytemuck::cast_slice(x.q);
    let xs = xq.chunks_exact(BLOCK).zip(x.d.iter().zip(x.s));
    let mut acc = _mm256_setzero_ps();
    let mut offset = 0.0f32;
    match it {
        Int8Type::Q8_0 => {
            for (b, (xb, (&dx, _))) in w.as_chunks::<{ q8_0::BLOCK_BYTES }>().0.iter().zip(xs) {
                let p = madd_i8_i8(load32(&b[2..]), load32(xb));
                let s = _mm256_set1_ps(q8_0::scale(b) * dx);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc);
            }
        }
        Int8Type::Q4_0 => {
            for (b, (xb, (&dx, _))) in w.as_chunks::<{ q4_0::BLOCK_BYTES }>().0.iter().zip(xs) {
                let q = _mm256_sub_epi8(nibbles(&b[2..]), _mm256_set1_epi8(8));
                let p = madd_i8_i8(q, load32(xb));
                let s = _mm256_set1_ps(q4_0::scale(b) * dx);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc);
            }
        }
        Int8Type::Q4_1 => {
            for (b, (xb, (&dx, &sx))) in w.as_chunks::<{ q4_1::BLOCK_BYTES }>().0.iter().zip(xs) {
                let (d, m) = q4_1::scale_min(b);
                let p = madd_u8_i8(nibbles(&b[4..]), load32(xb));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * dx), acc);
                offset += m * sx;
            }
        }
    }
    hsum(acc) + offset
}

/// The two f16 values in the first 4 bytes of `b` as `[a, b, 0, 0]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn f16_pair(b: &[u8]) -> __m128 {
    let v = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    _mm_cvtph_ps(_mm_cvtsi32_si128(v as i32))
}

/// Asks for the cache line at `p + ahead` (no access happens: a prefetch
/// of an address past the data is harmless).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn prefetch(p: &[u8], ahead: usize) {
    _mm_prefetch::<_MM_HINT_T0>(p.as_ptr().wrapping_add(ahead).cast());
}

/// Rows per call of [`dot_i8_rows`].
pub(crate) const ROWS: usize = 4;

/// [`dot_i8`] of four weight rows with the same activation row: the
/// activation block is loaded once for the four rows, the f16 scales are
/// converted with F16C, and the four independent accumulator chains keep
/// the pipelines busy.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_i8_rows(it: Int8Type, w: [&[u8]; ROWS], x: Q8Row<'_>) -> [f32; ROWS] {
    let xq: &[u8] = bytemuck::cast_slice(x.q);
    let nb = x.d.len();
    let mut acc = [_mm256_setzero_ps(); ROWS];
    let mut off = [_mm_setzero_ps(); ROWS];
    match it {
        Int8Type::Q8_0 => {
            let ws = w.map(|r| &r.as_chunks::<{ q8_0::BLOCK_BYTES }>().0[..nb]);
            // The weights of the call after next: rows are usually
            // consecutive, so this runs ahead of the hardware prefetcher.
            let ahead = 2 * ROWS * nb * q8_0::BLOCK_BYTES;
            for i in 0..nb {
                for r in ws {
                    prefetch(&r[i], ahead);
                }
                let xb = load32(&xq[i * BLOCK..]);
                let dx = _mm_set_ss(x.d[i]);
                for r in 0..ROWS {
                    let b = &ws[r][i];
                    let p = madd_i8_i8(load32(&b[2..]), xb);
                    let s = _mm_mul_ss(f16_pair(&b[..4]), dx);
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(s), acc[r]);
                }
            }
        }
        Int8Type::Q4_0 => {
            let ws = w.map(|r| &r.as_chunks::<{ q4_0::BLOCK_BYTES }>().0[..nb]);
            // The weights of the call after next: rows are usually
            // consecutive, so this runs ahead of the hardware prefetcher.
            let ahead = 2 * ROWS * nb * q4_0::BLOCK_BYTES;
            for i in 0..nb {
                for r in ws {
                    prefetch(&r[i], ahead);
                }
                let xb = load32(&xq[i * BLOCK..]);
                let dx = _mm_set_ss(x.d[i]);
                for r in 0..ROWS {
                    let b = &ws[r][i];
                    let q = _mm256_sub_epi8(nibbles(&b[2..]), _mm256_set1_epi8(8));
                    let p = madd_i8_i8(q, xb);
                    let s = _mm_mul_ss(f16_pair(&b[..4]), dx);
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(s), acc[r]);
                }
            }
        }
        Int8Type::Q4_1 => {
            let ws = w.map(|r| &r.as_chunks::<{ q4_1::BLOCK_BYTES }>().0[..nb]);
            // The weights of the call after next: rows are usually
            // consecutive, so this runs ahead of the hardware prefetcher.
            let ahead = 2 * ROWS * nb * q4_1::BLOCK_BYTES;
            for i in 0..nb {
                for r in ws {
                    prefetch(&r[i], ahead);
                }
                let xb = load32(&xq[i * BLOCK..]);
                // Lane 0: the scale product; lane 1: the offset term.
                let xs = _mm_setr_ps(x.d[i], x.s[i], 0.0, 0.0);
                for r in 0..ROWS {
                    let b = &ws[r][i];
                    let prod = _mm_mul_ps(f16_pair(&b[..4]), xs);
                    off[r] = _mm_add_ps(off[r], prod);
                    let p = madd_u8_i8(nibbles(&b[4..]), xb);
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(prod), acc[r]);
                }
            }
        }
    }
    std::array::from_fn(|r| {
        let o = _mm_cvtss_f32(_mm_movehdup_ps(off[r]));
        hsum(acc[r]) + if it == Int8Type::Q4_1 { o } else { 0.0 }
    })
}

/// Quantizes `x` (a multiple of 32 long) into 8-bit blocks exactly as the
/// scalar `Q8Act::quantize` does (round half to even, same scale formula).
#[target_feature(enable = "avx2,fma")]
pub(crate) fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let blocks = x.chunks_exact(BLOCK).zip(q.chunks_exact_mut(BLOCK));
    for ((xb, qb), (d, s)) in blocks.zip(d.iter_mut().zip(s.iter_mut())) {
        let v = load_block(xb);
        let dv = block_amax(v) / 127.0;
        let id = _mm256_set1_ps(if dv == 0.0 { 0.0 } else { 1.0 / dv });
        let i = quantize_block(v, id);
        store_bytes(qb, pack_bytes(i));
        *d = dv;
        *s = dv * hsum_i32(add4(i)) as f32;
    }
}

/// `Σ a·q` of unsigned bytes `a` with a 16-bit activation block given as its
/// planes (`q = 128·hi + lo`): eight exact 32-bit partial sums.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn madd_u8_q16(a: __m256i, hi: __m256i, lo: __m256i) -> __m256i {
    _mm256_add_epi32(_mm256_slli_epi32::<7>(madd_u8_i8(a, hi)), madd_u8_i8(a, lo))
}

/// As [`madd_u8_q16`] for signed bytes `a` (`|a| · (plane with a's sign)`).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn madd_i8_q16(a: __m256i, hi: __m256i, lo: __m256i) -> __m256i {
    let abs = _mm256_sign_epi8(a, a);
    madd_u8_q16(abs, _mm256_sign_epi8(hi, a), _mm256_sign_epi8(lo, a))
}

/// `qact::dot_i16` of four weight rows with one 16-bit activation row,
/// organized as [`dot_i8_rows`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_i16_rows(it: Int8Type, w: [&[u8]; ROWS], x: Q16Row<'_>) -> [f32; ROWS] {
    let xh: &[u8] = bytemuck::cast_slice(x.hi);
    let xl: &[u8] = bytemuck::cast_slice(x.lo);
    let nb = x.d.len();
    let mut acc = [_mm256_setzero_ps(); ROWS];
    let mut off = [_mm_setzero_ps(); ROWS];
    match it {
        Int8Type::Q8_0 => {
            let ws = w.map(|r| &r.as_chunks::<{ q8_0::BLOCK_BYTES }>().0[..nb]);
            let ahead = 2 * ROWS * nb * q8_0::BLOCK_BYTES;
            for i in 0..nb {
                for r in ws {
                    prefetch(&r[i], ahead);
                }
                let (hi, lo) = (load32(&xh[i * BLOCK..]), load32(&xl[i * BLOCK..]));
                let dx = _mm_set_ss(x.d[i]);
                for r in 0..ROWS {
                    let b = &ws[r][i];
                    let p = madd_i8_q16(load32(&b[2..]), hi, lo);
                    let s = _mm_mul_ss(f16_pair(&b[..4]), dx);
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(s), acc[r]);
                }
            }
        }
        Int8Type::Q4_0 => {
            let ws = w.map(|r| &r.as_chunks::<{ q4_0::BLOCK_BYTES }>().0[..nb]);
            let ahead = 2 * ROWS * nb * q4_0::BLOCK_BYTES;
            for i in 0..nb {
                for r in ws {
                    prefetch(&r[i], ahead);
                }
                let (hi, lo) = (load32(&xh[i * BLOCK..]), load32(&xl[i * BLOCK..]));
                let dx = _mm_set_ss(x.d[i]);
                for r in 0..ROWS {
                    let b = &ws[r][i];
                    let q = _mm256_sub_epi8(nibbles(&b[2..]), _mm256_set1_epi8(8));
                    let p = madd_i8_q16(q, hi, lo);
                    let s = _mm_mul_ss(f16_pair(&b[..4]), dx);
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(s), acc[r]);
                }
            }
        }
        Int8Type::Q4_1 => {
            let ws = w.map(|r| &r.as_chunks::<{ q4_1::BLOCK_BYTES }>().0[..nb]);
            let ahead = 2 * ROWS * nb * q4_1::BLOCK_BYTES;
            for i in 0..nb {
                for r in ws {
                    prefetch(&r[i], ahead);
                }
                let (hi, lo) = (load32(&xh[i * BLOCK..]), load32(&xl[i * BLOCK..]));
                // Lane 0: the scale product; lane 1: the offset term.
                let xs = _mm_setr_ps(x.d[i], x.s[i], 0.0, 0.0);
                for r in 0..ROWS {
                    let b = &ws[r][i];
                    let prod = _mm_mul_ps(f16_pair(&b[..4]), xs);
                    off[r] = _mm_add_ps(off[r], prod);
                    let p = madd_u8_q16(nibbles(&b[4..]), hi, lo);
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(prod), acc[r]);
                }
            }
        }
    }
    std::array::from_fn(|r| {
        let o = _mm_cvtss_f32(_mm_movehdup_ps(off[r]));
        hsum(acc[r]) + if it == Int8Type::Q4_1 { o } else { 0.0 }
    })
}

/// Quantizes `x` into 16-bit values stored as two planes split at `SHIFT`
/// bits, one scale per `per_scale` values (a multiple of 32 that divides
/// the length of `x`), exactly as the scalar `qact::quantize_q16_into`
/// does. With one scale per block, the blocks go eight at a time (see
/// [`quantize_run`]) and the last ones one by one.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn quantize_row_q16<const SHIFT: u32>(
    x: &[f32],
    hi: &mut [i8],
    lo: &mut [i8],
    mut scales: BlockScales<'_>,
    per_scale: usize,
) {
    let (mut x, mut first) = (x, 0);
    if per_scale == BLOCK {
        let (runs, rest) = x.as_chunks::<RUN_VALUES>();
        for (r, run) in runs.iter().enumerate() {
            quantize_run::<SHIFT>(run, hi, lo, &mut scales, r * RUN_BLOCKS);
        }
        (x, first) = (rest, runs.len() * RUN_BLOCKS);
    }
    for (c, xc) in x.chunks_exact(per_scale).enumerate() {
        let amax = xc
            .chunks_exact(BLOCK)
            .fold(0.0f32, |m, xb| m.max(block_amax(load_block(xb))));
        let (dv, id) = q16_scale::<SHIFT>(amax);
        let id = _mm256_set1_ps(id);
        for (i, xb) in xc.chunks_exact(BLOCK).enumerate() {
            let b = first + c * per_scale / BLOCK + i;
            let q = quantize_block(load_block(xb), id);
            store_planes::<SHIFT>(q, &mut hi[b * BLOCK..], &mut lo[b * BLOCK..]);
            scales.set(b, dv, hsum_i32(add4(q)));
        }
    }
}

/// Blocks that [`quantize_run`] quantizes at once: one per lane.
const RUN_BLOCKS: usize = 8;

/// Values of a [`quantize_run`].
const RUN_VALUES: usize = RUN_BLOCKS * BLOCK;

/// `quantize_row_q16` with one scale per block, for the eight blocks of
/// `run` (the row's blocks `first..first + 8`): each block's largest
/// magnitude and sum end in one lane of a vector by a transposing
/// reduction of all eight blocks' vectors, and the scales come from one
/// division of eight lanes (the same correctly rounded divisions as
/// `q16_scale`'s, so the same bits), not one reduction and one scalar
/// division per block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn quantize_run<const SHIFT: u32>(
    run: &[f32; RUN_VALUES],
    hi: &mut [i8],
    lo: &mut [i8],
    scales: &mut BlockScales<'_>,
    first: usize,
) {
    let blocks = run.as_chunks::<BLOCK>().0;
    let amax = transpose_reduce(
        std::array::from_fn(|j| _mm256_castps_si256(lane_amax(load_block(&blocks[j])))),
        |a, b| {
            let m = _mm256_max_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b));
            _mm256_castps_si256(m)
        },
    );
    let d = _mm256_div_ps(_mm256_castsi256_ps(amax), _mm256_set1_ps(q16_max(SHIFT)));
    let nonzero = _mm256_cmp_ps::<_CMP_NEQ_UQ>(d, _mm256_setzero_ps());
    let id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0), d), nonzero);
    let mut ids = [0.0f32; RUN_BLOCKS];
    store_lanes(&mut ids, _mm256_castps_si256(id));
    let sums = transpose_reduce(
        std::array::from_fn(|j| {
            let b = first + j;
            let id = _mm256_set1_ps(ids[j]);
            let q = quantize_block(load_block(&blocks[j]), id);
            store_planes::<SHIFT>(q, &mut hi[b * BLOCK..], &mut lo[b * BLOCK..]);
            add4(q)
        }),
        |a, b| _mm256_add_epi32(a, b),
    );
    let s = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sums));
    store_lanes(&mut scales.d[first..], _mm256_castps_si256(d));
    store_lanes(&mut scales.s[first..], _mm256_castps_si256(s));
    store_lanes(&mut scales.sums[first..], sums);
}

/// Lane `j` of the result is `op` over the eight lanes of `v[j]` (`op`
/// associative and commutative on 32-bit lanes): three rounds of pairing
/// vectors, each round halving their number and the lanes each still
/// spans.
#[target_feature(enable = "avx2")]
#[inline]
fn transpose_reduce(v: [__m256i; 8], op: impl Fn(__m256i, __m256i) -> __m256i) -> __m256i {
    // Within 128-bit lanes: `a`'s partial results to even 32-bit places,
    // `b`'s to odd ones.
    let v: [__m256i; 4] = std::array::from_fn(|k| {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        op(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b))
    });
    // Within 128-bit lanes: one 32-bit place per vector of four.
    let v: [__m256i; 2] = std::array::from_fn(|k| {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        op(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b))
    });
    // Across the two 128-bit lanes.
    op(
        _mm256_permute2x128_si256::<0x20>(v[0], v[1]),
        _mm256_permute2x128_si256::<0x31>(v[0], v[1]),
    )
}

/// The 32 values of a block, as four vectors.
#[target_feature(enable = "avx2")]
#[inline]
fn load_block(xb: &[f32]) -> [__m256; 4] {
    std::array::from_fn(|j| {
        let p = &xb[j * 8..j * 8 + 8];
        // SAFETY: `p` holds 8 floats and `loadu` has no alignment
        // requirement.
        unsafe { _mm256_loadu_ps(p.as_ptr()) }
    })
}

/// A block's values times `id`, rounded to the nearest integer.
#[target_feature(enable = "avx2")]
#[inline]
fn quantize_block(v: [__m256; 4], id: __m256) -> [__m256i; 4] {
    v.map(|v| {
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(v, id),
        );
        _mm256_cvtps_epi32(r)
    })
}

/// The lane sums of four vectors.
#[target_feature(enable = "avx2")]
#[inline]
fn add4(q: [__m256i; 4]) -> __m256i {
    _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]))
}

/// The sum of the eight 32-bit lanes of `v`.
#[target_feature(enable = "avx2")]
#[inline]
fn hsum_i32(v: __m256i) -> i32 {
    let sum = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b01_00_11_10>(sum));
    let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b10_11_00_01>(sum));
    _mm_cvtsi128_si32(sum)
}

/// Splits a block's 32 quantized values into its planes (`hi = (q +
/// round) >> SHIFT`, `lo = q − (hi << SHIFT)`), stored at the start of
/// `hi` and `lo`.
#[target_feature(enable = "avx2")]
#[inline]
fn store_planes<const SHIFT: u32>(q: [__m256i; 4], hi: &mut [i8], lo: &mut [i8]) {
    let shift = _mm_cvtsi32_si128(SHIFT as i32);
    let round = _mm256_set1_epi32(if SHIFT == WIDE { 128 } else { 0 });
    let h = q.map(|q| _mm256_sra_epi32(_mm256_add_epi32(q, round), shift));
    let l: [__m256i; 4] =
        std::array::from_fn(|j| _mm256_sub_epi32(q[j], _mm256_sll_epi32(h[j], shift)));
    store_bytes(hi, pack_bytes(h));
    store_bytes(lo, pack_bytes(l));
}

/// The 32 values of `v` saturated to bytes, in order.
#[target_feature(enable = "avx2")]
#[inline]
fn pack_bytes(v: [__m256i; 4]) -> __m256i {
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(v[0], v[1]),
        _mm256_packs_epi32(v[2], v[3]),
    );
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Stores 32 bytes at the start of `dst`.
#[target_feature(enable = "avx2")]
#[inline]
fn store_bytes(dst: &mut [i8], v: __m256i) {
    let dst = &mut dst[..BLOCK];
    // SAFETY: `dst` holds 32 bytes (sliced above) and `storeu` has no
    // alignment requirement.
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) };
}

/// Stores the eight 32-bit lanes of `v` at the start of `out`.
#[target_feature(enable = "avx2")]
#[inline]
fn store_lanes<T: Copy>(out: &mut [T], v: __m256i) {
    const { assert!(std::mem::size_of::<T>() == 4, "32-bit lanes") };
    let out = &mut out[..RUN_BLOCKS];
    // SAFETY: `out` holds eight values of 4 bytes each (sliced above,
    // their size checked at compile time) and `storeu` has no alignment
    // requirement.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), v) };
}

/// Lane by lane, the largest magnitude of the four vectors `v`.
#[target_feature(enable = "avx2")]
#[inline]
fn lane_amax(v: [__m256; 4]) -> __m256 {
    let sign = _mm256_set1_ps(-0.0);
    let m = v.map(|v| _mm256_andnot_ps(sign, v));
    _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]))
}

/// The largest magnitude of the 32 values `v`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn block_amax(v: [__m256; 4]) -> f32 {
    let m = lane_amax(v);
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}
