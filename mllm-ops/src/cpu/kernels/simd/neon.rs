//! aarch64 NEON (Advanced SIMD) kernels of both activation paths:
//!
//! * f32 activations: per-format dequantizers (bit-exact with
//!   [`crate::quant`]) and a register-blocked f32 tile product;
//! * 8-bit activations: integer dot products of Q8_0, Q4_0 and Q4_1 weight
//!   rows, with the dot-product extension's `sdot` (four byte products
//!   summed into each 32-bit lane) when the CPU has it, else with widening
//!   byte multiplies (`smull`) and pairwise 32-bit accumulation (`sadalp`).
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting NEON (see `QuantKernel`); the `sdot`
//! variant is only called after detecting the dot-product extension too.

use std::arch::aarch64::*;
use std::arch::asm;
use std::arch::is_aarch64_feature_detected;

use crate::cpu::kernels::qact::{Int8Type, Q8Row, BLOCK};
use crate::quant::{
    iq4_nl, iq4_xs, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, QuantType,
};

/// f32 lanes per vector.
const LANES: usize = 4;

/// Loads 4 floats from the start of `x`.
#[target_feature(enable = "neon")]
#[inline]
fn load(x: &[f32]) -> float32x4_t {
    let x = &x[..LANES];
    // SAFETY: `x` holds 4 floats (sliced above); `ld1` has no alignment
    // requirement beyond the element's.
    unsafe { vld1q_f32(x.as_ptr()) }
}

/// Stores 4 floats at the start of `out`.
#[target_feature(enable = "neon")]
#[inline]
fn store(out: &mut [f32], v: float32x4_t) {
    let out = &mut out[..LANES];
    // SAFETY: `out` holds 4 floats (sliced above); `st1` has no alignment
    // requirement beyond the element's.
    unsafe { vst1q_f32(out.as_mut_ptr(), v) }
}

/// The first 16 bytes of `b`.
#[target_feature(enable = "neon")]
#[inline]
fn load16(b: &[u8]) -> uint8x16_t {
    let b = &b[..16];
    // SAFETY: `b` holds 16 bytes (sliced above); byte loads need no
    // alignment.
    unsafe { vld1q_u8(b.as_ptr()) }
}

/// The first 16 bytes of `b` as signed bytes.
#[target_feature(enable = "neon")]
#[inline]
fn load16_i8(b: &[i8]) -> int8x16_t {
    let b = &b[..16];
    // SAFETY: as in `load16`.
    unsafe { vld1q_s8(b.as_ptr()) }
}

/// Sixteen signed bytes as four vectors of f32 (values 0..4, 4..8, 8..12,
/// 12..16; exact).
#[target_feature(enable = "neon")]
#[inline]
fn widen(v: int8x16_t) -> [float32x4_t; 4] {
    let lo = vmovl_s8(vget_low_s8(v));
    let hi = vmovl_high_s8(v);
    [
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
        vcvtq_f32_s32(vmovl_high_s16(lo)),
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
        vcvtq_f32_s32(vmovl_high_s16(hi)),
    ]
}

/// Bytes reinterpreted as signed (two's complement).
#[target_feature(enable = "neon")]
#[inline]
fn signed(v: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(v)
}

/// The low nibbles of `raw` (values 0..16 of a Q4 run) and the high ones
/// (values 16..32), as signed bytes `0..=15`.
#[target_feature(enable = "neon")]
#[inline]
fn nibbles(raw: uint8x16_t) -> [int8x16_t; 2] {
    [
        signed(vandq_u8(raw, vdupq_n_u8(0x0F))),
        signed(vshrq_n_u8::<4>(raw)),
    ]
}

/// `[d·v]` for each vector of `v`.
#[target_feature(enable = "neon")]
#[inline]
fn scaled(v: [float32x4_t; 4], d: float32x4_t) -> [float32x4_t; 4] {
    v.map(|q| vmulq_f32(d, q))
}

/// One decoded run of 16 values: its offset in the block and its values.
type Piece = (usize, [float32x4_t; 4]);

/// Q8_0, half `c` of 2: values `16c..16c + 16`.
#[target_feature(enable = "neon")]
#[inline]
fn q8_0_piece(b: &[u8; q8_0::BLOCK_BYTES], d: float32x4_t, c: usize) -> Piece {
    let q = signed(load16(&b[2 + 16 * c..]));
    (16 * c, scaled(widen(q), d))
}

/// Q4_0: values `0..16` (low nibbles) and `16..32` (high), `d·(q − 8)`.
#[target_feature(enable = "neon")]
#[inline]
fn q4_0_pieces(b: &[u8; q4_0::BLOCK_BYTES]) -> [Piece; 2] {
    let d = vdupq_n_f32(q4_0::scale(b));
    let [lo, hi] = nibbles(load16(&b[2..])).map(|q| vsubq_s8(q, vdupq_n_s8(8)));
    [(0, scaled(widen(lo), d)), (16, scaled(widen(hi), d))]
}

/// Q4_1: as Q4_0 with `d·q + m` (multiply, then add).
#[target_feature(enable = "neon")]
#[inline]
fn q4_1_pieces(b: &[u8; q4_1::BLOCK_BYTES]) -> [Piece; 2] {
    let (d, m) = q4_1::scale_min(b);
    let (d, m) = (vdupq_n_f32(d), vdupq_n_f32(m));
    let val = |q: int8x16_t| widen(q).map(|v| vaddq_f32(vmulq_f32(d, v), m));
    let [lo, hi] = nibbles(load16(&b[4..]));
    [(0, val(lo)), (16, val(hi))]
}

/// The 32 five-bit values of a Q5_0 or Q5_1 block whose `qh` starts at
/// `b[high]`: values `0..16` and `16..32`, as signed bytes `0..=31`.
#[target_feature(enable = "neon")]
#[inline]
fn q5_values(b: &[u8], high: usize) -> [int8x16_t; 2] {
    let qh: [u8; 32] = std::array::from_fn(|i| ((b[high + i / 8] >> (i % 8)) & 1) << 4);
    let [lo, hi] = nibbles(load16(&b[high + 4..]));
    [
        vorrq_s8(lo, signed(load16(&qh[..16]))),
        vorrq_s8(hi, signed(load16(&qh[16..]))),
    ]
}

/// Q5_0: values `0..16` and `16..32`, `d·(q − 16)`.
#[target_feature(enable = "neon")]
#[inline]
fn q5_0_pieces(b: &[u8; q5_0::BLOCK_BYTES]) -> [Piece; 2] {
    let d = vdupq_n_f32(q5_0::scale(b));
    let [lo, hi] = q5_values(b, 2).map(|q| vsubq_s8(q, vdupq_n_s8(16)));
    [(0, scaled(widen(lo), d)), (16, scaled(widen(hi), d))]
}

/// Q5_1: values `0..16` and `16..32`, `d·q + m` (multiply, then add).
#[target_feature(enable = "neon")]
#[inline]
fn q5_1_pieces(b: &[u8; q5_1::BLOCK_BYTES]) -> [Piece; 2] {
    let (d, m) = q5_1::scale_min(b);
    let (d, m) = (vdupq_n_f32(d), vdupq_n_f32(m));
    let val = |q: int8x16_t| widen(q).map(|v| vaddq_f32(vmulq_f32(d, v), m));
    let [lo, hi] = q5_values(b, 4);
    [(0, val(lo)), (16, val(hi))]
}

/// Q4_K, group `g` of 4 and half `c` of 2: values `64g + 16c..` (low
/// nibbles, sub-block `2g`) and `64g + 32 + 16c..` (high, sub-block
/// `2g + 1`), `d·sc·q − dmin·m` (multiply, then subtract).
#[target_feature(enable = "neon")]
#[inline]
fn q4_k_pieces(
    b: &[u8; q4_k::BLOCK_BYTES],
    dl: &[f32; 8],
    ml: &[f32; 8],
    g: usize,
    c: usize,
) -> [Piece; 2] {
    let [lo, hi] = nibbles(load16(&q4_k::qs(b)[32 * g + 16 * c..]));
    let val = |q: int8x16_t, j: usize| {
        let (d, m) = (vdupq_n_f32(dl[j]), vdupq_n_f32(ml[j]));
        widen(q).map(|v| vsubq_f32(vmulq_f32(d, v), m))
    };
    [
        (64 * g + 16 * c, val(lo, 2 * g)),
        (64 * g + 32 + 16 * c, val(hi, 2 * g + 1)),
    ]
}

/// Q5_K, group `g` of 4 and half `c` of 2: values `64g + 16c..`
/// (sub-block `2g`) and `64g + 32 + 16c..` (sub-block `2g + 1`),
/// `d·sc·q − dmin·m` (multiply, then subtract).
#[target_feature(enable = "neon")]
#[inline]
fn q5_k_pieces(
    b: &[u8; q5_k::BLOCK_BYTES],
    dl: &[f32; 8],
    ml: &[f32; 8],
    g: usize,
    c: usize,
) -> [Piece; 2] {
    let [lo, hi] = nibbles(load16(&q5_k::qs(b)[32 * g + 16 * c..]));
    let high = vshlq_u8(load16(&q5_k::qh(b)[16 * c..]), vdupq_n_s8(-(2 * g as i8)));
    let one = vdupq_n_u8(1);
    let fifth = |bits: uint8x16_t| signed(vshlq_n_u8::<4>(vandq_u8(bits, one)));
    let lo = vorrq_s8(lo, fifth(high));
    let hi = vorrq_s8(hi, fifth(vshrq_n_u8::<1>(high)));
    let val = |q: int8x16_t, j: usize| {
        let (d, m) = (vdupq_n_f32(dl[j]), vdupq_n_f32(ml[j]));
        widen(q).map(|v| vsubq_f32(vmulq_f32(d, v), m))
    };
    [
        (64 * g + 16 * c, val(lo, 2 * g)),
        (64 * g + 32 + 16 * c, val(hi, 2 * g + 1)),
    ]
}

/// Q6_K, half `h` of 2 and run `c` of 2: the four quarters' values
/// `128h + 32k + 16c..` for `k = 0..4` (sub-block `8h + 2k + c`),
/// `d·sc·(q − 32)`.
#[target_feature(enable = "neon")]
#[inline]
fn q6_k_pieces(b: &[u8; q6_k::BLOCK_BYTES], dl: &[f32; 16], h: usize, c: usize) -> [Piece; 4] {
    let l = 16 * c;
    let a = load16(&b[64 * h + l..]);
    let bb = load16(&b[64 * h + 32 + l..]);
    let hb = load16(&b[128 + 32 * h + l..]);
    let m4 = vdupq_n_u8(0x0F);
    let top = |bits: uint8x16_t| vshlq_n_u8::<4>(vandq_u8(bits, vdupq_n_u8(3)));
    let q = [
        vorrq_u8(vandq_u8(a, m4), top(hb)),
        vorrq_u8(vandq_u8(bb, m4), top(vshrq_n_u8::<2>(hb))),
        vorrq_u8(vshrq_n_u8::<4>(a), top(vshrq_n_u8::<4>(hb))),
        vorrq_u8(vshrq_n_u8::<4>(bb), top(vshrq_n_u8::<6>(hb))),
    ];
    let mut out = [(0, [vdupq_n_f32(0.0); 4]); 4];
    for (k, (o, q)) in out.iter_mut().zip(q).enumerate() {
        let v = widen(vsubq_s8(signed(q), vdupq_n_s8(32)));
        let s = vdupq_n_f32(dl[8 * h + 2 * k + c]);
        *o = (128 * h + 32 * k + l, scaled(v, s));
    }
    out
}

/// `(v >> shift) & mask` for each byte of `v`.
#[target_feature(enable = "neon")]
#[inline]
fn bits(v: uint8x16_t, shift: usize, mask: u8) -> uint8x16_t {
    vandq_u8(vshlq_u8(v, vdupq_n_s8(-(shift as i8))), vdupq_n_u8(mask))
}

/// Q2_K, half `n` of 2, shift `j` of 4 and run `c` of 2: values
/// `128n + 32j + 16c..` (sub-block `8n + 2j + c`), `d·sc·q − dmin·m`.
#[target_feature(enable = "neon")]
#[inline]
fn q2_k_piece(
    b: &[u8; q2_k::BLOCK_BYTES],
    dl: &[f32; 16],
    ml: &[f32; 16],
    (n, j, c): (usize, usize, usize),
) -> Piece {
    let q = signed(bits(load16(&q2_k::qs(b)[32 * n + 16 * c..]), 2 * j, 3));
    let s = 8 * n + 2 * j + c;
    let (d, m) = (vdupq_n_f32(dl[s]), vdupq_n_f32(ml[s]));
    let v = widen(q).map(|v| vsubq_f32(vmulq_f32(d, v), m));
    (128 * n + 32 * j + 16 * c, v)
}

/// Q3_K, half `n` of 2, shift `j` of 4 and run `c` of 2: values
/// `128n + 32j + 16c..` (sub-block `8n + 2j + c`), `dl·(q − 4)`.
#[target_feature(enable = "neon")]
#[inline]
fn q3_k_piece(
    b: &[u8; q3_k::BLOCK_BYTES],
    dl: &[f32; 16],
    (n, j, c): (usize, usize, usize),
) -> Piece {
    let low = bits(load16(&b[32 + 32 * n + 16 * c..]), 2 * j, 3);
    let high = bits(load16(&b[16 * c..]), 4 * n + j, 1);
    let q = vsubq_s8(signed(vorrq_u8(low, vshlq_n_u8::<2>(high))), vdupq_n_s8(4));
    let s = 8 * n + 2 * j + c;
    (
        128 * n + 32 * j + 16 * c,
        scaled(widen(q), vdupq_n_f32(dl[s])),
    )
}

/// IQ4_NL (and one IQ4_XS sub-block) of the 16 bytes `qs`: values `0..16`
/// and `16..32`, `dl·grid[q]`.
#[target_feature(enable = "neon")]
#[inline]
fn iq4_pieces(qs: &[u8], dl: f32) -> [Piece; 2] {
    let grid = load16_i8(&iq4_nl::GRID);
    let d = vdupq_n_f32(dl);
    let [lo, hi] = nibbles(load16(qs)).map(|idx| vqtbl1q_s8(grid, vreinterpretq_u8_s8(idx)));
    [(0, scaled(widen(lo), d)), (16, scaled(widen(hi), d))]
}

/// Stores a decoded run of 16 values at its offset in `out`.
#[target_feature(enable = "neon")]
#[inline]
fn put(out: &mut [f32], (at, v): Piece) {
    for (o, v) in out[at..at + 16].chunks_exact_mut(LANES).zip(v) {
        store(o, v);
    }
}

/// Decodes one Q8_0 block.
#[target_feature(enable = "neon")]
#[inline]
fn decode_q8_0(b: &[u8; q8_0::BLOCK_BYTES], out: &mut [f32; q8_0::BLOCK_LEN]) {
    let d = vdupq_n_f32(q8_0::scale(b));
    for c in 0..2 {
        put(out, q8_0_piece(b, d, c));
    }
}

/// Decodes one Q4_0 block.
#[target_feature(enable = "neon")]
#[inline]
fn decode_q4_0(b: &[u8; q4_0::BLOCK_BYTES], out: &mut [f32; q4_0::BLOCK_LEN]) {
    for p in q4_0_pieces(b) {
        put(out, p);
    }
}

/// Decodes one Q4_1 block.
#[target_feature(enable = "neon")]
#[inline]
fn decode_q4_1(b: &[u8; q4_1::BLOCK_BYTES], out: &mut [f32; q4_1::BLOCK_LEN]) {
    for p in q4_1_pieces(b) {
        put(out, p);
    }
}

/// Decodes one Q5_0 block.
#[target_feature(enable = "neon")]
#[inline]
fn decode_q5_0(b: &[u8; q5_0::BLOCK_BYTES], out: &mut [f32; q5_0::BLOCK_LEN]) {
    for p in q5_0_pieces(b) {
        put(out, p);
    }
}

/// Decodes one Q5_1 block.
#[target_feature(enable = "neon")]
#[inline]
fn decode_q5_1(b: &[u8; q5_1::BLOCK_BYTES], out: &mut [f32; q5_1::BLOCK_LEN]) {
    for p in q5_1_pieces(b) {
        put(out, p);
    }
}

/// Decodes one Q2_K block.
#[target_feature(enable = "neon")]
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
#[target_feature(enable = "neon")]
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
#[target_feature(enable = "neon")]
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
#[target_feature(enable = "neon")]
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
#[target_feature(enable = "neon")]
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
#[target_feature(enable = "neon")]
#[inline]
fn decode_iq4_nl(b: &[u8; iq4_nl::BLOCK_BYTES], out: &mut [f32; iq4_nl::BLOCK_LEN]) {
    for p in iq4_pieces(&b[2..], iq4_nl::scale(b)) {
        put(out, p);
    }
}

/// Decodes one IQ4_XS block.
#[target_feature(enable = "neon")]
#[inline]
fn decode_iq4_xs(b: &[u8; iq4_xs::BLOCK_BYTES], out: &mut [f32; iq4_xs::BLOCK_LEN]) {
    let dl = iq4_xs::sub_scales(b);
    for (j, &dl) in dl.iter().enumerate() {
        for (at, v) in iq4_pieces(iq4_xs::qs(b, j), dl) {
            put(out, (32 * j + at, v));
        }
    }
}

super::dequantize_row!("neon");

/// The `R × C` dot products of `R` activation rows with `C` weight rows,
/// all of length `k` (a multiple of [`LANES`]).
#[target_feature(enable = "neon")]
#[inline]
#[allow(clippy::needless_range_loop)]
fn micro<const R: usize, const C: usize>(
    xs: [&[f32]; R],
    ws: [&[f32]; C],
    k: usize,
) -> [[f32; C]; R] {
    let mut acc = [[vdupq_n_f32(0.0); C]; R];
    let mut i = 0;
    while i < k {
        let mut xv = [vdupq_n_f32(0.0); R];
        for r in 0..R {
            xv[r] = load(&xs[r][i..]);
        }
        for c in 0..C {
            let wv = load(&ws[c][i..]);
            for r in 0..R {
                acc[r][c] = vfmaq_f32(acc[r][c], xv[r], wv);
            }
        }
        i += LANES;
    }
    let mut res = [[0.0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            res[r][c] = vaddvq_f32(acc[r][c]);
        }
    }
    res
}

/// [`micro`] for any `k`: the vector part over whole lane groups, then
/// the remaining columns one by one. Each product is summed in the same
/// order whatever `R` and `C` are (the float linear layer's micro-kernel).
#[target_feature(enable = "neon")]
pub(crate) fn micro_any<const R: usize, const C: usize>(
    xs: [&[f32]; R],
    ws: [&[f32]; C],
    k: usize,
) -> [[f32; C]; R] {
    let full = k / LANES * LANES;
    let mut res = micro::<R, C>(xs, ws, full);
    super::add_tails(&mut res, xs, ws, (full, k), |v| v);
    res
}

super::tile_gemm!("neon", micro, LANES);

/// `acc + Σ` of four products of signed bytes `a` and `b` per 32-bit lane,
/// with the dot-product extension's `sdot`.
#[target_feature(enable = "neon,dotprod")]
#[inline]
fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` only reads and writes the three vector registers
    // named; this function is only reached after the dot-product
    // extension was detected (it is a `#[target_feature]` function).
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// Four 32-bit lanes summing to the exact block sum `Σ_j w[j]·x[j]` of 32
/// signed bytes (`w` and `x` as two halves of 16), with `sdot`.
#[target_feature(enable = "neon,dotprod")]
#[inline]
fn isum_sdot(w: [int8x16_t; 2], x: [int8x16_t; 2]) -> int32x4_t {
    sdot(sdot(vdupq_n_s32(0), w[0], x[0]), w[1], x[1])
}

/// As [`isum_sdot`] without the extension: byte products widened to 16
/// bits (`|w·x| ≤ 128 · 127`) and added in pairs into 32-bit lanes.
#[target_feature(enable = "neon")]
#[inline]
fn isum_widen(w: [int8x16_t; 2], x: [int8x16_t; 2]) -> int32x4_t {
    let mut acc = vdupq_n_s32(0);
    for (a, b) in w.into_iter().zip(x) {
        acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
        acc = vpadalq_s16(acc, vmull_high_s8(a, b));
    }
    acc
}

/// Defines an integer-path dot product from a block-sum function (see
/// `qact::dot_i8` for the definition): per block the exact integer sum in
/// four 32-bit lanes, scaled by `d_w·d_x` and accumulated in f32 lanes.
macro_rules! int8_dot {
    ($name:ident, $features:literal, $isum:ident) => {
        #[target_feature(enable = $features)]
        fn $name(it: Int8Type, w: &[u8], x: Q8Row<'_>) -> f32 {
            let xs = x.q.chunks_exact(BLOCK).zip(x.d.iter().zip(x.s));
            let xv = |xb: &[i8]| [load16_i8(xb), load16_i8(&xb[16..])];
            let mut acc = vdupq_n_f32(0.0);
            let mut offset = 0.0f32;
            match it {
                Int8Type::Q8_0 => {
                    for (b, (xb, (&dx, _))) in
                        w.as_chunks::<{ q8_0::BLOCK_BYTES }>().0.iter().zip(xs)
                    {
                        let q = [signed(load16(&b[2..])), signed(load16(&b[18..]))];
                        let p = vcvtq_f32_s32($isum(q, xv(xb)));
                        acc = vfmaq_f32(acc, p, vdupq_n_f32(q8_0::scale(b) * dx));
                    }
                }
                Int8Type::Q4_0 => {
                    for (b, (xb, (&dx, _))) in
                        w.as_chunks::<{ q4_0::BLOCK_BYTES }>().0.iter().zip(xs)
                    {
                        let q = nibbles(load16(&b[2..])).map(|q| vsubq_s8(q, vdupq_n_s8(8)));
                        let p = vcvtq_f32_s32($isum(q, xv(xb)));
                        acc = vfmaq_f32(acc, p, vdupq_n_f32(q4_0::scale(b) * dx));
                    }
                }
                Int8Type::Q4_1 => {
                    for (b, (xb, (&dx, &sx))) in
                        w.as_chunks::<{ q4_1::BLOCK_BYTES }>().0.iter().zip(xs)
                    {
                        let (d, m) = q4_1::scale_min(b);
                        let p = vcvtq_f32_s32($isum(nibbles(load16(&b[4..])), xv(xb)));
                        acc = vfmaq_f32(acc, p, vdupq_n_f32(d * dx));
                        offset += m * sx;
                    }
                }
            }
            vaddvq_f32(acc) + offset
        }
    };
}

int8_dot!(dot_i8_sdot, "neon,dotprod", isum_sdot);
int8_dot!(dot_i8_widen, "neon", isum_widen);

/// The integer-path dot product of a weight row with an activation row:
/// `sdot` when this CPU has the dot-product extension, widening multiplies
/// otherwise.
#[target_feature(enable = "neon")]
pub(crate) fn dot_i8(it: Int8Type, w: &[u8], x: Q8Row<'_>) -> f32 {
    if is_aarch64_feature_detected!("dotprod") {
        // SAFETY: the dot-product extension was just detected, and NEON is
        // enabled in this function.
        unsafe { dot_i8_sdot(it, w, x) }
    } else {
        dot_i8_widen(it, w, x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::qact::{self, Q8Act};
    use crate::cpu::kernels::qkernel::tests::random_blocks;
    use crate::cpu::kernels::qkernel::{QuantKernel, QuantPath, SimdLevel};
    use crate::cpu::kernels::test_util::Rng;

    /// On aarch64 both paths pick NEON.
    #[test]
    fn detection_picks_neon() {
        if !is_aarch64_feature_detected!("neon") {
            eprintln!("skipping: this CPU lacks NEON");
            return;
        }
        for path in [QuantPath::F32Activations, QuantPath::Int8Activations] {
            assert_eq!(QuantKernel::new(path).level(), SimdLevel::Neon, "{path:?}");
        }
    }

    /// Both integer variants (the `sdot` one where the CPU has the
    /// dot-product extension) give exactly the scalar block sums, so they
    /// agree with the scalar int8 dot up to the f32 accumulation order:
    /// `|neon − scalar| ≤ 1e-5 · Σ|w_i x_i|`, for block counts that are not
    /// multiples of the vector width.
    #[test]
    fn int8_variants_match_scalar() {
        if !is_aarch64_feature_detected!("neon") {
            eprintln!("skipping the NEON int8 kernels: this CPU lacks NEON");
            return;
        }
        let dotprod = is_aarch64_feature_detected!("dotprod");
        if !dotprod {
            eprintln!("skipping the sdot int8 kernel: this CPU lacks the dot-product extension");
        }
        let mut rng = Rng::new(41);
        for qt in [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1] {
            let it = Int8Type::from_quant(qt).unwrap();
            for n in [1, 2, 3, 5, 7, 8] {
                let w = random_blocks(&mut rng, qt, n);
                let xq = Q8Act::quantize(&rng.vec(n * BLOCK, 1.0));
                let x = xq.row();
                let mut wf = vec![0.0f32; n * BLOCK];
                qt.dequantize_blocks(&w, &mut wf);
                let mag: f64 = (0..n * BLOCK)
                    .map(|i| (wf[i] as f64 * x.q[i] as f64 * x.d[i / BLOCK] as f64).abs())
                    .sum();
                let want = qact::dot_i8(it, &w, x);
                // SAFETY: NEON was detected above.
                let mut got = vec![("widen", unsafe { dot_i8_widen(it, &w, x) })];
                if dotprod {
                    // SAFETY: NEON and the dot-product extension were
                    // detected above.
                    got.push(("sdot", unsafe { dot_i8_sdot(it, &w, x) }));
                }
                for (name, g) in got {
                    assert!(
                        ((g - want) as f64).abs() <= 1e-5 * mag,
                        "{name} {qt} n={n}: {g} vs {want}"
                    );
                }
            }
        }
    }

    /// The extreme byte values give exact block sums in both variants
    /// (`−128` only occurs in weights; activations stay in `−127..=127`).
    #[test]
    fn int8_block_sums_are_exact_at_the_extremes() {
        if !is_aarch64_feature_detected!("neon") {
            eprintln!("skipping the NEON int8 kernels: this CPU lacks NEON");
            return;
        }
        let mut w = [0u8; q8_0::BLOCK_BYTES];
        w[..2].copy_from_slice(&half::f16::ONE.to_le_bytes());
        w[2..].fill(0x80);
        let x = Q8Act::quantize(&[-1.0; BLOCK]);
        let want = 128.0 * 127.0 * 32.0 * x.row().d[0];
        // SAFETY: NEON was detected above.
        let got = unsafe { dot_i8_widen(Int8Type::Q8_0, &w, x.row()) };
        assert_eq!(got, want);
        if is_aarch64_feature_detected!("dotprod") {
            // SAFETY: NEON and the dot-product extension were detected.
            let got = unsafe { dot_i8_sdot(Int8Type::Q8_0, &w, x.row()) };
            assert_eq!(got, want);
        } else {
            eprintln!("skipping the sdot int8 kernel: this CPU lacks the dot-product extension");
        }
    }
}
