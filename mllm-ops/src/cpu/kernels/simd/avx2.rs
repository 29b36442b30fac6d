//! AVX2 + FMA kernels for the f32-activation path: per-format dequantizers
//! (bit-exact with [`crate::quant`]) and a register-blocked f32 tile
//! product.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2 and FMA (see `QuantKernel`).

use std::arch::x86_64::*;

use crate::cpu::kernels::packed::GROUP_ROWS;
use crate::quant::{
    iq4_nl, iq4_xs, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, QuantType,
};

/// f32 lanes per vector.
pub(crate) const LANES: usize = 8;

/// Loads 8 floats from the start of `x`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn load(x: &[f32]) -> __m256 {
    let x = &x[..LANES];
    // SAFETY: `x` holds 8 floats (sliced above) and `loadu` has no alignment
    // requirement.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

/// Stores 8 floats at the start of `out`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn store(out: &mut [f32], v: __m256) {
    let out = &mut out[..LANES];
    // SAFETY: `out` holds 8 floats (sliced above) and `storeu` has no
    // alignment requirement.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) }
}

/// Stores the outputs of a pass over two groups `a` and `b` for `T` rows
/// at the start of their output rows (the two-group kernels' last step).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn store_pair<const T: usize>(
    acc: [[__m256; T]; 2],
    (out_a, out_b): (&mut [[f32; GROUP_ROWS]], &mut [[f32; GROUP_ROWS]]),
) {
    for t in 0..T {
        store(&mut out_a[t], acc[0][t]);
        store(&mut out_b[t], acc[1][t]);
    }
}

/// The first 8 bytes of `b` zero-extended to 8 `i32` lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn bytes_u32(b: &[u8]) -> __m256i {
    let b = &b[..8];
    // SAFETY: `b` holds 8 bytes (sliced above), exactly what `loadl_epi64`
    // reads, unaligned.
    let v = unsafe { _mm_loadl_epi64(b.as_ptr().cast()) };
    _mm256_cvtepu8_epi32(v)
}

/// The first 8 bytes of `b` as `i8`, sign-extended to 8 `i32` lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn bytes_i32(b: &[u8]) -> __m256i {
    let b = &b[..8];
    // SAFETY: as in `bytes_u32`.
    let v = unsafe { _mm_loadl_epi64(b.as_ptr().cast()) };
    _mm256_cvtepi8_epi32(v)
}

/// Sum of the 8 lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// `i32` lanes to f32.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn cvt(v: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(v)
}

/// One decoded vector: its element offset in the block and its 8 values.
type Piece = (usize, __m256);

/// Q8_0, chunk `c` of 4: values `8c..8c + 8`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q8_0_piece(b: &[u8; q8_0::BLOCK_BYTES], d: __m256, c: usize) -> Piece {
    (8 * c, _mm256_mul_ps(cvt(bytes_i32(&b[2 + 8 * c..])), d))
}

/// Q4_0, chunk `c` of 2: values `8c..` (low nibbles) and `16 + 8c..` (high).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q4_0_pieces(b: &[u8; q4_0::BLOCK_BYTES], d: __m256, c: usize) -> [Piece; 2] {
    let raw = bytes_u32(&b[2 + 8 * c..]);
    let eight = _mm256_set1_epi32(8);
    let lo = _mm256_sub_epi32(_mm256_and_si256(raw, _mm256_set1_epi32(15)), eight);
    let hi = _mm256_sub_epi32(_mm256_srli_epi32::<4>(raw), eight);
    [
        (8 * c, _mm256_mul_ps(d, cvt(lo))),
        (16 + 8 * c, _mm256_mul_ps(d, cvt(hi))),
    ]
}

/// Q4_1, chunk `c` of 2: as Q4_0 with `d·q + m` (multiply, then add).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q4_1_pieces(b: &[u8; q4_1::BLOCK_BYTES], d: __m256, m: __m256, c: usize) -> [Piece; 2] {
    let raw = bytes_u32(&b[4 + 8 * c..]);
    let lo = _mm256_and_si256(raw, _mm256_set1_epi32(15));
    let hi = _mm256_srli_epi32::<4>(raw);
    [
        (8 * c, _mm256_add_ps(_mm256_mul_ps(d, cvt(lo)), m)),
        (16 + 8 * c, _mm256_add_ps(_mm256_mul_ps(d, cvt(hi)), m)),
    ]
}

/// Bits `first..first + 8` of `qh`, one per lane, as 16 or 0 (the fifth
/// bits of Q5_0 and Q5_1 values).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn fifth_bits(qh: u32, first: usize) -> __m256i {
    let shifts = _mm256_add_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(first as i32),
    );
    let bits = _mm256_srlv_epi32(_mm256_set1_epi32(qh as i32), shifts);
    _mm256_slli_epi32::<4>(_mm256_and_si256(bits, _mm256_set1_epi32(1)))
}

/// Q5_0 and Q5_1, chunk `c` of 2: the five-bit values `8c..` and
/// `16 + 8c..` of the block whose `qh` starts at `b[high]`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q5_values(b: &[u8], high: usize, c: usize) -> [__m256i; 2] {
    let qh = u32::from_le_bytes([b[high], b[high + 1], b[high + 2], b[high + 3]]);
    let raw = bytes_u32(&b[high + 4 + 8 * c..]);
    let lo = _mm256_and_si256(raw, _mm256_set1_epi32(15));
    let hi = _mm256_srli_epi32::<4>(raw);
    [
        _mm256_or_si256(lo, fifth_bits(qh, 8 * c)),
        _mm256_or_si256(hi, fifth_bits(qh, 16 + 8 * c)),
    ]
}

/// Q5_0, chunk `c` of 2: values `8c..` and `16 + 8c..`, `d·(q − 16)`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q5_0_pieces(b: &[u8; q5_0::BLOCK_BYTES], d: __m256, c: usize) -> [Piece; 2] {
    let sixteen = _mm256_set1_epi32(16);
    let [lo, hi] = q5_values(b, 2, c).map(|q| cvt(_mm256_sub_epi32(q, sixteen)));
    [
        (8 * c, _mm256_mul_ps(d, lo)),
        (16 + 8 * c, _mm256_mul_ps(d, hi)),
    ]
}

/// Q5_1, chunk `c` of 2: values `8c..` and `16 + 8c..`, `d·q + m`
/// (multiply, then add).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q5_1_pieces(b: &[u8; q5_1::BLOCK_BYTES], d: __m256, m: __m256, c: usize) -> [Piece; 2] {
    let [lo, hi] = q5_values(b, 4, c).map(|q| cvt(q));
    [
        (8 * c, _mm256_add_ps(_mm256_mul_ps(d, lo), m)),
        (16 + 8 * c, _mm256_add_ps(_mm256_mul_ps(d, hi), m)),
    ]
}

/// Q5_K, group `g` of 4 and chunk `c` of 4: values `64g + 8c..`
/// (sub-block `2g`) and `64g + 32 + 8c..` (sub-block `2g + 1`).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q5_k_pieces(
    b: &[u8; q5_k::BLOCK_BYTES],
    dl: &[f32; 8],
    ml: &[f32; 8],
    g: usize,
    c: usize,
) -> [Piece; 2] {
    let raw = bytes_u32(&q5_k::qs(b)[32 * g + 8 * c..]);
    let high = _mm256_srlv_epi32(
        bytes_u32(&q5_k::qh(b)[8 * c..]),
        _mm256_set1_epi32(2 * g as i32),
    );
    let one = _mm256_set1_epi32(1);
    let fifth = |bits: __m256i| _mm256_slli_epi32::<4>(_mm256_and_si256(bits, one));
    let lo = _mm256_or_si256(_mm256_and_si256(raw, _mm256_set1_epi32(15)), fifth(high));
    let hi = _mm256_or_si256(
        _mm256_srli_epi32::<4>(raw),
        fifth(_mm256_srli_epi32::<1>(high)),
    );
    let val = |q: __m256i, j: usize| {
        _mm256_sub_ps(
            _mm256_mul_ps(_mm256_set1_ps(dl[j]), cvt(q)),
            _mm256_set1_ps(ml[j]),
        )
    };
    [
        (64 * g + 8 * c, val(lo, 2 * g)),
        (64 * g + 32 + 8 * c, val(hi, 2 * g + 1)),
    ]
}

/// Q4_K, group `g` of 4 and chunk `c` of 4: values `64g + 8c..` (low
/// nibbles, sub-block `2g`) and `64g + 32 + 8c..` (high, sub-block `2g + 1`).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q4_k_pieces(
    b: &[u8; q4_k::BLOCK_BYTES],
    dl: &[f32; 8],
    ml: &[f32; 8],
    g: usize,
    c: usize,
) -> [Piece; 2] {
    let raw = bytes_u32(&q4_k::qs(b)[32 * g + 8 * c..]);
    let lo = _mm256_and_si256(raw, _mm256_set1_epi32(15));
    let hi = _mm256_srli_epi32::<4>(raw);
    let val = |q: __m256i, j: usize| {
        _mm256_sub_ps(
            _mm256_mul_ps(_mm256_set1_ps(dl[j]), cvt(q)),
            _mm256_set1_ps(ml[j]),
        )
    };
    [
        (64 * g + 8 * c, val(lo, 2 * g)),
        (64 * g + 32 + 8 * c, val(hi, 2 * g + 1)),
    ]
}

/// Q6_K, half `h` of 2 and chunk `c` of 4: the four quarters' values
/// `128h + 32k + 8c..` for `k = 0..4` (sub-block `8h + 2k + c / 2`).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q6_k_pieces(b: &[u8; q6_k::BLOCK_BYTES], dl: &[f32; 16], h: usize, c: usize) -> [Piece; 4] {
    let l = 8 * c;
    let a = bytes_u32(&b[64 * h + l..]);
    let bb = bytes_u32(&b[64 * h + 32 + l..]);
    let hb = bytes_u32(&b[128 + 32 * h + l..]);
    let m4 = _mm256_set1_epi32(15);
    let m2 = _mm256_set1_epi32(3);
    let top = |bits: __m256i| _mm256_slli_epi32::<4>(_mm256_and_si256(bits, m2));
    let q = [
        _mm256_or_si256(_mm256_and_si256(a, m4), top(hb)),
        _mm256_or_si256(_mm256_and_si256(bb, m4), top(_mm256_srli_epi32::<2>(hb))),
        _mm256_or_si256(_mm256_srli_epi32::<4>(a), top(_mm256_srli_epi32::<4>(hb))),
        _mm256_or_si256(_mm256_srli_epi32::<4>(bb), top(_mm256_srli_epi32::<6>(hb))),
    ];
    let mut out = [(0, _mm256_setzero_ps()); 4];
    for (k, (o, q)) in out.iter_mut().zip(q).enumerate() {
        let v = cvt(_mm256_sub_epi32(q, _mm256_set1_epi32(32)));
        let s = _mm256_set1_ps(dl[8 * h + 2 * k + c / 2]);
        *o = (128 * h + 32 * k + l, _mm256_mul_ps(s, v));
    }
    out
}

/// Q2_K, half `n` of 2, shift `j` of 4 and chunk `c` of 4: values
/// `128n + 32j + 8c..` (sub-block `8n + 2j + c / 2`).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q2_k_piece(
    b: &[u8; q2_k::BLOCK_BYTES],
    dl: &[f32; 16],
    ml: &[f32; 16],
    (n, j, c): (usize, usize, usize),
) -> Piece {
    let raw = bytes_u32(&q2_k::qs(b)[32 * n + 8 * c..]);
    let q = _mm256_and_si256(
        _mm256_srlv_epi32(raw, _mm256_set1_epi32(2 * j as i32)),
        _mm256_set1_epi32(3),
    );
    let s = 8 * n + 2 * j + c / 2;
    let v = _mm256_sub_ps(
        _mm256_mul_ps(_mm256_set1_ps(dl[s]), cvt(q)),
        _mm256_set1_ps(ml[s]),
    );
    (128 * n + 32 * j + 8 * c, v)
}

/// Q3_K, half `n` of 2, shift `j` of 4 and chunk `c` of 4: values
/// `128n + 32j + 8c..` (sub-block `8n + 2j + c / 2`), `dl·(q − 4)`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q3_k_piece(
    b: &[u8; q3_k::BLOCK_BYTES],
    dl: &[f32; 16],
    (n, j, c): (usize, usize, usize),
) -> Piece {
    let low = _mm256_and_si256(
        _mm256_srlv_epi32(
            bytes_u32(&b[32 + 32 * n + 8 * c..]),
            _mm256_set1_epi32(2 * j as i32),
        ),
        _mm256_set1_epi32(3),
    );
    let high = _mm256_and_si256(
        _mm256_srlv_epi32(
            bytes_u32(&b[8 * c..]),
            _mm256_set1_epi32((4 * n + j) as i32),
        ),
        _mm256_set1_epi32(1),
    );
    let q = _mm256_sub_epi32(
        _mm256_or_si256(low, _mm256_slli_epi32::<2>(high)),
        _mm256_set1_epi32(4),
    );
    let s = 8 * n + 2 * j + c / 2;
    (
        128 * n + 32 * j + 8 * c,
        _mm256_mul_ps(_mm256_set1_ps(dl[s]), cvt(q)),
    )
}

/// IQ4_NL's grid values of the nibbles of 8 bytes of `qs`: the low nibbles
/// and the high ones, each as 8 `i32` lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn iq4_values(qs: &[u8]) -> [__m256i; 2] {
    let qs = &qs[..8];
    // SAFETY: `qs` holds 8 bytes (sliced above), exactly what
    // `loadl_epi64` reads, unaligned; the grid holds 16.
    let (raw, grid) = unsafe {
        (
            _mm_loadl_epi64(qs.as_ptr().cast()),
            _mm_loadu_si128(iq4_nl::GRID.as_ptr().cast()),
        )
    };
    let m4 = _mm_set1_epi8(15);
    let lo = _mm_and_si128(raw, m4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), m4);
    [lo, hi].map(|idx| _mm256_cvtepi8_epi32(_mm_shuffle_epi8(grid, idx)))
}

/// IQ4_NL (and one IQ4_XS sub-block), chunk `c` of 2 of the 16 bytes `qs`:
/// values `8c..` and `16 + 8c..`, `dl·grid[q]`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn iq4_pieces(qs: &[u8], dl: __m256, c: usize) -> [Piece; 2] {
    let [lo, hi] = iq4_values(&qs[8 * c..]);
    [
        (8 * c, _mm256_mul_ps(dl, cvt(lo))),
        (16 + 8 * c, _mm256_mul_ps(dl, cvt(hi))),
    ]
}

/// Stores a decoded piece at its offset in `out`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn put(out: &mut [f32], (at, v): Piece) {
    store(&mut out[at..], v);
}

/// Decodes one Q8_0 block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode_q8_0(b: &[u8; q8_0::BLOCK_BYTES], out: &mut [f32; q8_0::BLOCK_LEN]) {
    let d = _mm256_set1_ps(q8_0::scale(b));
    for c in 0..4 {
        put(out, q8_0_piece(b, d, c));
    }
}

/// Decodes one Q4_0 block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode_q4_0(b: &[u8; q4_0::BLOCK_BYTES], out: &mut [f32; q4_0::BLOCK_LEN]) {
    let d = _mm256_set1_ps(q4_0::scale(b));
    for c in 0..2 {
        for p in q4_0_pieces(b, d, c) {
            put(out, p);
        }
    }
}

/// Decodes one Q4_1 block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode_q4_1(b: &[u8; q4_1::BLOCK_BYTES], out: &mut [f32; q4_1::BLOCK_LEN]) {
    let (d, m) = q4_1::scale_min(b);
    let (d, m) = (_mm256_set1_ps(d), _mm256_set1_ps(m));
    for c in 0..2 {
        for p in q4_1_pieces(b, d, m, c) {
            put(out, p);
        }
    }
}

/// Decodes one Q5_0 block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode_q5_0(b: &[u8; q5_0::BLOCK_BYTES], out: &mut [f32; q5_0::BLOCK_LEN]) {
    let d = _mm256_set1_ps(q5_0::scale(b));
    for c in 0..2 {
        for p in q5_0_pieces(b, d, c) {
            put(out, p);
        }
    }
}

/// Decodes one Q5_1 block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode_q5_1(b: &[u8; q5_1::BLOCK_BYTES], out: &mut [f32; q5_1::BLOCK_LEN]) {
    let (d, m) = q5_1::scale_min(b);
    let (d, m) = (_mm256_set1_ps(d), _mm256_set1_ps(m));
    for c in 0..2 {
        for p in q5_1_pieces(b, d, m, c) {
            put(out, p);
        }
    }
}

/// Decodes one Q2_K block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode_q2_k(b: &[u8; q2_k::BLOCK_BYTES], out: &mut [f32; q2_k::BLOCK_LEN]) {
    let (dl, ml) = q2_k::sub_scales(b);
    for n in 0..2 {
        for j in 0..4 {
            for c in 0..4 {
                put(out, q2_k_piece(b, &dl, &ml, (n, j, c)));
            }
        }
    }
}

/// Decodes one Q3_K block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode_q3_k(b: &[u8; q3_k::BLOCK_BYTES], out: &mut [f32; q3_k::BLOCK_LEN]) {
    let dl = q3_k::sub_scales(b);
    for n in 0..2 {
        for j in 0..4 {
            for c in 0..4 {
                put(out, q3_k_piece(b, &dl, (n, j, c)));
            }
        }
    }
}

/// Decodes one Q4_K block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode_q4_k(b: &[u8; q4_k::BLOCK_BYTES], out: &mut [f32; q4_k::BLOCK_LEN]) {
    let (dl, ml) = q4_k::sub_scales(b);
    for g in 0..4 {
        for c in 0..4 {
            for p in q4_k_pieces(b, &dl, &ml, g, c) {
                put(out, p);
            }
        }
    }
}

/// Decodes one Q5_K block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode_q5_k(b: &[u8; q5_k::BLOCK_BYTES], out: &mut [f32; q5_k::BLOCK_LEN]) {
    let (dl, ml) = q5_k::sub_scales(b);
    for g in 0..4 {
        for c in 0..4 {
            for p in q5_k_pieces(b, &dl, &ml, g, c) {
                put(out, p);
            }
        }
    }
}

/// Decodes one Q6_K block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode_q6_k(b: &[u8; q6_k::BLOCK_BYTES], out: &mut [f32; q6_k::BLOCK_LEN]) {
    let dl = q6_k::sub_scales(b);
    for h in 0..2 {
        for c in 0..4 {
            for p in q6_k_pieces(b, &dl, h, c) {
                put(out, p);
            }
        }
    }
}

/// Decodes one IQ4_NL block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode_iq4_nl(b: &[u8; iq4_nl::BLOCK_BYTES], out: &mut [f32; iq4_nl::BLOCK_LEN]) {
    let d = _mm256_set1_ps(iq4_nl::scale(b));
    for c in 0..2 {
        for p in iq4_pieces(&b[2..], d, c) {
            put(out, p);
        }
    }
}

/// Decodes one IQ4_XS block.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode_iq4_xs(b: &[u8; iq4_xs::BLOCK_BYTES], out: &mut [f32; iq4_xs::BLOCK_LEN]) {
    let dl = iq4_xs::sub_scales(b);
    for (j, &dl) in dl.iter().enumerate() {
        let d = _mm256_set1_ps(dl);
        for c in 0..2 {
            for (at, v) in iq4_pieces(iq4_xs::qs(b, j), d, c) {
                put(out, (32 * j + at, v));
            }
        }
    }
}

super::dequantize_row!("avx2,fma");

/// The `R × C` dot products of `R` activation rows with `C` weight rows,
/// all of length `k` (a multiple of [`LANES`]).
#[target_feature(enable = "avx2,fma")]
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
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)]
fn micro_with<const R: usize, const C: usize, T>(
    xs: [&[f32]; R],
    ws: [&[T]; C],
    k: usize,
    load_w: impl Fn(&[T]) -> __m256,
) -> [[f32; C]; R] {
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut i = 0;
    while i < k {
        let mut xv = [_mm256_setzero_ps(); R];
        for r in 0..R {
            xv[r] = load(&xs[r][i..]);
        }
        for c in 0..C {
            let wv = load_w(&ws[c][i..]);
            for r in 0..R {
                acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
            }
        }
        i += LANES;
    }
    let mut res = [[0.0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            res[r][c] = hsum(acc[r][c]);
        }
    }
    res
}

/// 8 f16 values (raw bits) from the start of `w`, as f32 (exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load_f16(w: &[u16]) -> __m256 {
    let w = &w[..LANES];
    // SAFETY: `w` holds 8 `u16` (sliced above), the 16 bytes `loadu_si128`
    // reads, unaligned.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(w.as_ptr().cast()) })
}

/// [`micro_any`] with f16 weight rows (raw bits) converted in registers:
/// bit for bit what [`micro_any`] gives on the rows converted to f32.
#[target_feature(enable = "avx2,fma,f16c")]
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

/// 8 bf16 values (raw bits) from the start of `w`, as f32 (exact: the
/// bits shifted into the high half).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn load_bf16(w: &[u16]) -> __m256 {
    let w = &w[..LANES];
    // SAFETY: `w` holds 8 `u16` (sliced above), the 16 bytes `loadu_si128`
    // reads, unaligned.
    let bits = _mm256_cvtepu16_epi32(unsafe { _mm_loadu_si128(w.as_ptr().cast()) });
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
}

/// [`micro_f16_any`] for bf16 weight rows.
#[target_feature(enable = "avx2,fma")]
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
#[target_feature(enable = "avx2,fma")]
#[inline]
fn micro_tail<const R: usize, const C: usize, T: Copy>(
    xs: [&[f32]; R],
    ws: [&[T]; C],
    k: usize,
    load_w: impl Fn(&[T]) -> __m256,
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
#[target_feature(enable = "avx2,fma")]
pub(crate) fn micro_any<const R: usize, const C: usize>(
    xs: [&[f32]; R],
    ws: [&[f32]; C],
    k: usize,
) -> [[f32; C]; R] {
    micro_tail(xs, ws, k, |w| load(w), |v| v)
}

super::tile_gemm!("avx2,fma", micro, LANES);
