//! AVX-512F kernels for the f32-activation path; the same functions as
//! [`super::avx2`] on 16-lane vectors.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX-512F (see `QuantKernel`).

use std::arch::x86_64::*;

use crate::quant::{
    iq4_nl, iq4_xs, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, QuantType,
};

/// f32 lanes per vector.
pub(crate) const LANES: usize = 16;

/// Loads 16 floats from the start of `x`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn load(x: &[f32]) -> __m512 {
    let x = &x[..LANES];
    // SAFETY: `x` holds 16 floats (sliced above) and `loadu` has no
    // alignment requirement.
    unsafe { _mm512_loadu_ps(x.as_ptr()) }
}

/// Stores 16 floats at the start of `out`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn store(out: &mut [f32], v: __m512) {
    let out = &mut out[..LANES];
    // SAFETY: `out` holds 16 floats (sliced above) and `storeu` has no
    // alignment requirement.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) }
}

/// The first 16 bytes of `b`.
#[target_feature(enable = "avx512f")]
#[inline]
fn bytes16(b: &[u8]) -> __m128i {
    let b = &b[..16];
    // SAFETY: `b` holds 16 bytes (sliced above), exactly what `loadu_si128`
    // reads, unaligned.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// The first 16 bytes of `b` zero-extended to 16 `i32` lanes.
#[target_feature(enable = "avx512f")]
#[inline]
fn bytes_u32(b: &[u8]) -> __m512i {
    _mm512_cvtepu8_epi32(bytes16(b))
}

/// `i32` lanes to f32.
#[target_feature(enable = "avx512f")]
#[inline]
fn cvt(v: __m512i) -> __m512 {
    _mm512_cvtepi32_ps(v)
}

/// One decoded vector: its element offset in the block and its 16 values.
type Piece = (usize, __m512);

/// Q8_0, chunk `c` of 2: values `16c..16c + 16`.
#[target_feature(enable = "avx512f")]
#[inline]
fn q8_0_piece(b: &[u8; q8_0::BLOCK_BYTES], d: __m512, c: usize) -> Piece {
    let q = _mm512_cvtepi8_epi32(bytes16(&b[2 + 16 * c..]));
    (16 * c, _mm512_mul_ps(cvt(q), d))
}

/// Q4_0: values `0..16` (low nibbles) and `16..32` (high nibbles).
#[target_feature(enable = "avx512f")]
#[inline]
fn q4_0_pieces(b: &[u8; q4_0::BLOCK_BYTES], d: __m512) -> [Piece; 2] {
    let raw = bytes_u32(&b[2..]);
    let eight = _mm512_set1_epi32(8);
    let lo = _mm512_sub_epi32(_mm512_and_si512(raw, _mm512_set1_epi32(15)), eight);
    let hi = _mm512_sub_epi32(_mm512_srli_epi32::<4>(raw), eight);
    [
        (0, _mm512_mul_ps(d, cvt(lo))),
        (16, _mm512_mul_ps(d, cvt(hi))),
    ]
}

/// Q4_1: as Q4_0 with `d·q + m` (multiply, then add).
#[target_feature(enable = "avx512f")]
#[inline]
fn q4_1_pieces(b: &[u8; q4_1::BLOCK_BYTES], d: __m512, m: __m512) -> [Piece; 2] {
    let raw = bytes_u32(&b[4..]);
    let lo = _mm512_and_si512(raw, _mm512_set1_epi32(15));
    let hi = _mm512_srli_epi32::<4>(raw);
    [
        (0, _mm512_add_ps(_mm512_mul_ps(d, cvt(lo)), m)),
        (16, _mm512_add_ps(_mm512_mul_ps(d, cvt(hi)), m)),
    ]
}

/// The 32 five-bit values of a Q5_0 or Q5_1 block whose `qh` starts at
/// `b[high]`: values `0..16` and `16..32`.
#[target_feature(enable = "avx512f")]
#[inline]
fn q5_values(b: &[u8], high: usize) -> [__m512i; 2] {
    let qh = u32::from_le_bytes([b[high], b[high + 1], b[high + 2], b[high + 3]]);
    let raw = bytes_u32(&b[high + 4..]);
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let fifth = |first: i32| {
        let shifts = _mm512_add_epi32(lanes, _mm512_set1_epi32(first));
        let bits = _mm512_srlv_epi32(_mm512_set1_epi32(qh as i32), shifts);
        _mm512_slli_epi32::<4>(_mm512_and_si512(bits, _mm512_set1_epi32(1)))
    };
    [
        _mm512_or_si512(_mm512_and_si512(raw, _mm512_set1_epi32(15)), fifth(0)),
        _mm512_or_si512(_mm512_srli_epi32::<4>(raw), fifth(16)),
    ]
}

/// Q5_0: values `0..16` and `16..32`, `d·(q − 16)`.
#[target_feature(enable = "avx512f")]
#[inline]
fn q5_0_pieces(b: &[u8; q5_0::BLOCK_BYTES], d: __m512) -> [Piece; 2] {
    let sixteen = _mm512_set1_epi32(16);
    let [lo, hi] = q5_values(b, 2).map(|q| cvt(_mm512_sub_epi32(q, sixteen)));
    [(0, _mm512_mul_ps(d, lo)), (16, _mm512_mul_ps(d, hi))]
}

/// Q5_1: values `0..16` and `16..32`, `d·q + m` (multiply, then add).
#[target_feature(enable = "avx512f")]
#[inline]
fn q5_1_pieces(b: &[u8; q5_1::BLOCK_BYTES], d: __m512, m: __m512) -> [Piece; 2] {
    let [lo, hi] = q5_values(b, 4).map(|q| cvt(q));
    [
        (0, _mm512_add_ps(_mm512_mul_ps(d, lo), m)),
        (16, _mm512_add_ps(_mm512_mul_ps(d, hi), m)),
    ]
}

/// `dl·q − ml` for 16 nibbles.
#[target_feature(enable = "avx512f")]
#[inline]
fn affine(q: __m512i, dl: f32, ml: f32) -> __m512 {
    _mm512_sub_ps(
        _mm512_mul_ps(_mm512_set1_ps(dl), cvt(q)),
        _mm512_set1_ps(ml),
    )
}

/// Q4_K, group `g` of 4 and chunk `c` of 2: values `64g + 16c..` (low
/// nibbles, sub-block `2g`) and `64g + 32 + 16c..` (high, sub-block `2g + 1`).
#[target_feature(enable = "avx512f")]
#[inline]
fn q4_k_pieces(
    b: &[u8; q4_k::BLOCK_BYTES],
    dl: &[f32; 8],
    ml: &[f32; 8],
    g: usize,
    c: usize,
) -> [Piece; 2] {
    let raw = bytes_u32(&q4_k::qs(b)[32 * g + 16 * c..]);
    let lo = _mm512_and_si512(raw, _mm512_set1_epi32(15));
    let hi = _mm512_srli_epi32::<4>(raw);
    [
        (64 * g + 16 * c, affine(lo, dl[2 * g], ml[2 * g])),
        (
            64 * g + 32 + 16 * c,
            affine(hi, dl[2 * g + 1], ml[2 * g + 1]),
        ),
    ]
}

/// Q5_K, group `g` of 4 and chunk `c` of 2: values `64g + 16c..`
/// (sub-block `2g`) and `64g + 32 + 16c..` (sub-block `2g + 1`).
#[target_feature(enable = "avx512f")]
#[inline]
fn q5_k_pieces(
    b: &[u8; q5_k::BLOCK_BYTES],
    dl: &[f32; 8],
    ml: &[f32; 8],
    g: usize,
    c: usize,
) -> [Piece; 2] {
    let raw = bytes_u32(&q5_k::qs(b)[32 * g + 16 * c..]);
    let high = _mm512_srlv_epi32(
        bytes_u32(&q5_k::qh(b)[16 * c..]),
        _mm512_set1_epi32(2 * g as i32),
    );
    let one = _mm512_set1_epi32(1);
    let fifth = |bits: __m512i| _mm512_slli_epi32::<4>(_mm512_and_si512(bits, one));
    let lo = _mm512_or_si512(_mm512_and_si512(raw, _mm512_set1_epi32(15)), fifth(high));
    let hi = _mm512_or_si512(
        _mm512_srli_epi32::<4>(raw),
        fifth(_mm512_srli_epi32::<1>(high)),
    );
    [
        (64 * g + 16 * c, affine(lo, dl[2 * g], ml[2 * g])),
        (
            64 * g + 32 + 16 * c,
            affine(hi, dl[2 * g + 1], ml[2 * g + 1]),
        ),
    ]
}

/// Q6_K, half `h` of 2 and chunk `c` of 2: the four quarters' values
/// `128h + 32k + 16c..` for `k = 0..4` (sub-block `8h + 2k + c`).
#[target_feature(enable = "avx512f")]
#[inline]
fn q6_k_pieces(b: &[u8; q6_k::BLOCK_BYTES], dl: &[f32; 16], h: usize, c: usize) -> [Piece; 4] {
    let l = 16 * c;
    let a = bytes_u32(&b[64 * h + l..]);
    let bb = bytes_u32(&b[64 * h + 32 + l..]);
    let hb = bytes_u32(&b[128 + 32 * h + l..]);
    let m4 = _mm512_set1_epi32(15);
    let m2 = _mm512_set1_epi32(3);
    let top = |bits: __m512i| _mm512_slli_epi32::<4>(_mm512_and_si512(bits, m2));
    let q = [
        _mm512_or_si512(_mm512_and_si512(a, m4), top(hb)),
        _mm512_or_si512(_mm512_and_si512(bb, m4), top(_mm512_srli_epi32::<2>(hb))),
        _mm512_or_si512(_mm512_srli_epi32::<4>(a), top(_mm512_srli_epi32::<4>(hb))),
        _mm512_or_si512(_mm512_srli_epi32::<4>(bb), top(_mm512_srli_epi32::<6>(hb))),
    ];
    let mut out = [(0, _mm512_setzero_ps()); 4];
    for (k, (o, q)) in out.iter_mut().zip(q).enumerate() {
        let v = cvt(_mm512_sub_epi32(q, _mm512_set1_epi32(32)));
        let s = _mm512_set1_ps(dl[8 * h + 2 * k + c]);
        *o = (128 * h + 32 * k + l, _mm512_mul_ps(s, v));
    }
    out
}

/// Q2_K, half `n` of 2, shift `j` of 4 and chunk `c` of 2: values
/// `128n + 32j + 16c..` (sub-block `8n + 2j + c`).
#[target_feature(enable = "avx512f")]
#[inline]
fn q2_k_piece(
    b: &[u8; q2_k::BLOCK_BYTES],
    dl: &[f32; 16],
    ml: &[f32; 16],
    (n, j, c): (usize, usize, usize),
) -> Piece {
    let raw = bytes_u32(&q2_k::qs(b)[32 * n + 16 * c..]);
    let q = _mm512_and_si512(
        _mm512_srlv_epi32(raw, _mm512_set1_epi32(2 * j as i32)),
        _mm512_set1_epi32(3),
    );
    let s = 8 * n + 2 * j + c;
    (128 * n + 32 * j + 16 * c, affine(q, dl[s], ml[s]))
}

/// Q3_K, half `n` of 2, shift `j` of 4 and chunk `c` of 2: values
/// `128n + 32j + 16c..` (sub-block `8n + 2j + c`), `dl·(q − 4)`.
#[target_feature(enable = "avx512f")]
#[inline]
fn q3_k_piece(
    b: &[u8; q3_k::BLOCK_BYTES],
    dl: &[f32; 16],
    (n, j, c): (usize, usize, usize),
) -> Piece {
    let low = _mm512_and_si512(
        _mm512_srlv_epi32(
            bytes_u32(&b[32 + 32 * n + 16 * c..]),
            _mm512_set1_epi32(2 * j as i32),
        ),
        _mm512_set1_epi32(3),
    );
    let high = _mm512_and_si512(
        _mm512_srlv_epi32(
            bytes_u32(&b[16 * c..]),
            _mm512_set1_epi32((4 * n + j) as i32),
        ),
        _mm512_set1_epi32(1),
    );
    let q = _mm512_sub_epi32(
        _mm512_or_si512(low, _mm512_slli_epi32::<2>(high)),
        _mm512_set1_epi32(4),
    );
    let s = 8 * n + 2 * j + c;
    (
        128 * n + 32 * j + 16 * c,
        _mm512_mul_ps(_mm512_set1_ps(dl[s]), cvt(q)),
    )
}

/// IQ4_NL (and one IQ4_XS sub-block) of the 16 bytes `qs`: values `0..16`
/// and `16..32`, `dl·grid[q]`.
#[target_feature(enable = "avx512f")]
#[inline]
fn iq4_pieces(qs: &[u8], dl: __m512) -> [Piece; 2] {
    let raw = bytes16(qs);
    // SAFETY: the grid holds 16 bytes, what `loadu_si128` reads, unaligned.
    let grid = unsafe { _mm_loadu_si128(iq4_nl::GRID.as_ptr().cast()) };
    let m4 = _mm_set1_epi8(15);
    let lo = _mm_and_si128(raw, m4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), m4);
    let val =
        |idx: __m128i| _mm512_mul_ps(dl, cvt(_mm512_cvtepi8_epi32(_mm_shuffle_epi8(grid, idx))));
    [(0, val(lo)), (16, val(hi))]
}

/// Stores a decoded piece at its offset in `out`.
#[target_feature(enable = "avx512f")]
#[inline]
fn put(out: &mut [f32], (at, v): Piece) {
    store(&mut out[at..], v);
}

/// Decodes one Q8_0 block.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_q8_0(b: &[u8; q8_0::BLOCK_BYTES], out: &mut [f32; q8_0::BLOCK_LEN]) {
    let d = _mm512_set1_ps(q8_0::scale(b));
    for c in 0..2 {
        put(out, q8_0_piece(b, d, c));
    }
}

/// Decodes one Q4_0 block.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_q4_0(b: &[u8; q4_0::BLOCK_BYTES], out: &mut [f32; q4_0::BLOCK_LEN]) {
    for p in q4_0_pieces(b, _mm512_set1_ps(q4_0::scale(b))) {
        put(out, p);
    }
}

/// Decodes one Q4_1 block.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_q4_1(b: &[u8; q4_1::BLOCK_BYTES], out: &mut [f32; q4_1::BLOCK_LEN]) {
    let (d, m) = q4_1::scale_min(b);
    for p in q4_1_pieces(b, _mm512_set1_ps(d), _mm512_set1_ps(m)) {
        put(out, p);
    }
}

/// Decodes one Q5_0 block.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_q5_0(b: &[u8; q5_0::BLOCK_BYTES], out: &mut [f32; q5_0::BLOCK_LEN]) {
    for p in q5_0_pieces(b, _mm512_set1_ps(q5_0::scale(b))) {
        put(out, p);
    }
}

/// Decodes one Q5_1 block.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_q5_1(b: &[u8; q5_1::BLOCK_BYTES], out: &mut [f32; q5_1::BLOCK_LEN]) {
    let (d, m) = q5_1::scale_min(b);
    for p in q5_1_pieces(b, _mm512_set1_ps(d), _mm512_set1_ps(m)) {
        put(out, p);
    }
}

/// Decodes one Q2_K block.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_q2_k(b: &[u8; q2_k::BLOCK_BYTES], out: &mut [f32; q2_k::BLOCK_LEN]) {
    let (dl, ml) = q2_k::sub_scales(b);
    for n in 0..2 {
        for j in 0..4 {
            for c in 0..2 {
                put(out, q2_k_piece(b, &dl, &ml, (n, j, c)));
            }
        }
    }
}

/// Decodes one Q3_K block.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_q3_k(b: &[u8; q3_k::BLOCK_BYTES], out: &mut [f32; q3_k::BLOCK_LEN]) {
    let dl = q3_k::sub_scales(b);
    for n in 0..2 {
        for j in 0..4 {
            for c in 0..2 {
                put(out, q3_k_piece(b, &dl, (n, j, c)));
            }
        }
    }
}

/// Decodes one Q4_K block.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_q4_k(b: &[u8; q4_k::BLOCK_BYTES], out: &mut [f32; q4_k::BLOCK_LEN]) {
    let (dl, ml) = q4_k::sub_scales(b);
    for g in 0..4 {
        for c in 0..2 {
            for p in q4_k_pieces(b, &dl, &ml, g, c) {
                put(out, p);
            }
        }
    }
}

/// Decodes one Q5_K block.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_q5_k(b: &[u8; q5_k::BLOCK_BYTES], out: &mut [f32; q5_k::BLOCK_LEN]) {
    let (dl, ml) = q5_k::sub_scales(b);
    for g in 0..4 {
        for c in 0..2 {
            for p in q5_k_pieces(b, &dl, &ml, g, c) {
                put(out, p);
            }
        }
    }
}

/// Decodes one Q6_K block.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_q6_k(b: &[u8; q6_k::BLOCK_BYTES], out: &mut [f32; q6_k::BLOCK_LEN]) {
    let dl = q6_k::sub_scales(b);
    for h in 0..2 {
        for c in 0..2 {
            for p in q6_k_pieces(b, &dl, h, c) {
                put(out, p);
            }
        }
    }
}

/// Decodes one IQ4_NL block.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_iq4_nl(b: &[u8; iq4_nl::BLOCK_BYTES], out: &mut [f32; iq4_nl::BLOCK_LEN]) {
    for p in iq4_pieces(&b[2..], _mm512_set1_ps(iq4_nl::scale(b))) {
        put(out, p);
    }
}

/// Decodes one IQ4_XS block.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode_iq4_xs(b: &[u8; iq4_xs::BLOCK_BYTES], out: &mut [f32; iq4_xs::BLOCK_LEN]) {
    let dl = iq4_xs::sub_scales(b);
    for (j, &dl) in dl.iter().enumerate() {
        for (at, v) in iq4_pieces(iq4_xs::qs(b, j), _mm512_set1_ps(dl)) {
            put(out, (32 * j + at, v));
        }
    }
}

super::dequantize_row!("avx512f");

/// The `R × C` dot products of `R` activation rows with `C` weight rows,
/// all of length `k` (a multiple of [`LANES`]).
#[target_feature(enable = "avx512f")]
#[inline]
fn micro<const R: usize, const C: usize>(
    xs: [&[f32]; R],
    ws: [&[f32]; C],
    k: usize,
) -> [[f32; C]; R] {
    micro_with(xs, ws, k, |w| load(w))
}

/// [`micro`] over weight rows of any element type, `load_w` turning the
/// first [`LANES`] elements of a slice into f32 lanes: every product is
/// accumulated in the same lanes and order whatever the element type.
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::needless_range_loop)]
fn micro_with<const R: usize, const C: usize, T>(
    xs: [&[f32]; R],
    ws: [&[T]; C],
    k: usize,
    load_w: impl Fn(&[T]) -> __m512,
) -> [[f32; C]; R] {
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let mut i = 0;
    while i < k {
        let mut xv = [_mm512_setzero_ps(); R];
        for r in 0..R {
            xv[r] = load(&xs[r][i..]);
        }
        for c in 0..C {
            let wv = load_w(&ws[c][i..]);
            for r in 0..R {
                acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
            }
        }
        i += LANES;
    }
    let mut res = [[0.0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            res[r][c] = _mm512_reduce_add_ps(acc[r][c]);
        }
    }
    res
}

/// 16 f16 values (raw bits) from the start of `w`, as f32 (exact).
#[target_feature(enable = "avx512f")]
#[inline]
fn load_f16(w: &[u16]) -> __m512 {
    let w = &w[..LANES];
    // SAFETY: `w` holds 16 `u16` (sliced above), the 32 bytes
    // `loadu_si256` reads, unaligned.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(w.as_ptr().cast()) })
}

/// [`micro_any`] with f16 weight rows (raw bits) converted in registers:
/// bit for bit what [`micro_any`] gives on the rows converted to f32.
#[target_feature(enable = "avx512f")]
pub(crate) fn micro_f16_any<const R: usize, const C: usize>(
    xs: [&[f32]; R],
    ws: [&[u16]; C],
    k: usize,
) -> [[f32; C]; R] {
    micro_tail(
        xs,
        ws,
        k,
        |w| load_f16(w),
        |b| half::f16::from_bits(b).to_f32(),
    )
}

/// 16 bf16 values (raw bits) from the start of `w`, as f32 (exact: the
/// bits shifted into the high half).
#[target_feature(enable = "avx512f")]
#[inline]
fn load_bf16(w: &[u16]) -> __m512 {
    let w = &w[..LANES];
    // SAFETY: `w` holds 16 `u16` (sliced above), the 32 bytes
    // `loadu_si256` reads, unaligned.
    let bits = _mm512_cvtepu16_epi32(unsafe { _mm256_loadu_si256(w.as_ptr().cast()) });
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits))
}

/// [`micro_f16_any`] for bf16 weight rows.
#[target_feature(enable = "avx512f")]
pub(crate) fn micro_bf16_any<const R: usize, const C: usize>(
    xs: [&[f32]; R],
    ws: [&[u16]; C],
    k: usize,
) -> [[f32; C]; R] {
    micro_tail(
        xs,
        ws,
        k,
        |w| load_bf16(w),
        |b| half::bf16::from_bits(b).to_f32(),
    )
}

/// [`micro_with`] for any `k`: the vector part over whole lane groups
/// (`load_w` converts [`LANES`] weights to f32 lanes), then the remaining
/// columns one by one (`to_f32` converts one).
#[target_feature(enable = "avx512f")]
#[inline]
fn micro_tail<const R: usize, const C: usize, T: Copy>(
    xs: [&[f32]; R],
    ws: [&[T]; C],
    k: usize,
    load_w: impl Fn(&[T]) -> __m512,
    to_f32: impl Fn(T) -> f32,
) -> [[f32; C]; R] {
    let full = k / LANES * LANES;
    let mut res = micro_with(xs, ws, full, load_w);
    super::add_tails(&mut res, xs, ws, (full, k), to_f32);
    res
}

/// [`micro`] for any `k`: the vector part over whole lane groups, then
/// the remaining columns one by one. Each product is summed in the same
/// order whatever `R` and `C` are (the float linear layer's micro-kernel).
#[target_feature(enable = "avx512f")]
pub(crate) fn micro_any<const R: usize, const C: usize>(
    xs: [&[f32]; R],
    ws: [&[f32]; C],
    k: usize,
) -> [[f32; C]; R] {
    micro_tail(xs, ws, k, |w| load(w), |v| v)
}

super::tile_gemm!("avx512f", micro, LANES);
