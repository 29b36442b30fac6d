//! AVX2 (+ FMA, F16C) decoders of KV-cache rows (see `kv_rows`): eight values per
//! instruction, the same operations as the portable decoder (an exact
//! widening, then one multiply and for Q4_1 one separate add), so the
//! same bits. And the f16 and Q8_0 encoders of the rows a step writes,
//! eight values at a time with the portable encoders' rounding, so the
//! same bytes.

use std::arch::x86_64::*;
use std::ops::Range;

use mllm_core::KvDtype;

use super::avx2::{load, store};
use crate::cpu::kernels::kv_rows::{decode_portable, encode_portable};
use crate::cpu::kernels::simd::inline_array;
use crate::quant::{f16_at, q4_1, q8_0, to_f16};

/// Whether this CPU has what [`decode`] needs.
#[inline]
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Decodes the bytes `head` of every row of `src` (rows of `row_bytes`)
/// into consecutive rows of `dim` values of `out`. F16 heads of whole
/// groups of eight values take a loop of their own: through [`decode`],
/// each row's type dispatch and empty tail cost more than its conversions.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_rows(
    kind: KvDtype,
    src: &[u8],
    row_bytes: usize,
    head: Range<usize>,
    dim: usize,
    out: &mut [f32],
) {
    let rows = src.chunks_exact(row_bytes).zip(out.chunks_exact_mut(dim));
    if kind == KvDtype::F16 && dim.is_multiple_of(8) {
        for (row, o) in rows {
            f16_groups(&row[head.clone()], o);
        }
        return;
    }
    for (row, o) in rows {
        decode(kind, &row[head.clone()], o);
    }
}

/// Decodes `src` (the encoding of `out.len()` values as `kind`) into `out`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn decode(kind: KvDtype, src: &[u8], out: &mut [f32]) {
    match kind {
        KvDtype::F32 => decode_portable(kind, src, out),
        KvDtype::F16 => {
            let whole = out.len() / 8 * 8;
            f16_groups(src, &mut out[..whole]);
            decode_portable(kind, &src[2 * whole..], &mut out[whole..]);
        }
        KvDtype::Q8_0 => {
            let (blocks, _) = src.as_chunks::<{ q8_0::BLOCK_BYTES }>();
            let (outs, _) = out.as_chunks_mut::<{ q8_0::BLOCK_LEN }>();
            for (b, o) in blocks.iter().zip(outs) {
                let d = _mm256_set1_ps(f16_at(b, 0));
                for (g, o8) in o.chunks_exact_mut(8).enumerate() {
                    let q = _mm256_cvtepi8_epi32(load8(&b[2 + 8 * g..]));
                    store(o8, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
                }
            }
        }
        KvDtype::Q4_1 => {
            let (blocks, _) = src.as_chunks::<{ q4_1::BLOCK_BYTES }>();
            let (outs, _) = out.as_chunks_mut::<{ q4_1::BLOCK_LEN }>();
            let nibble = _mm_set1_epi8(0x0F);
            for (b, o) in blocks.iter().zip(outs) {
                let d = _mm256_set1_ps(f16_at(b, 0));
                let m = _mm256_set1_ps(f16_at(b, 2));
                let qs = load16(&b[4..]);
                // Values 0..16 are the low nibbles, 16..32 the high ones.
                let lo = _mm_and_si128(qs, nibble);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), nibble);
                let parts = [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)];
                let x = parts.map(|p| {
                    let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(p));
                    _mm256_add_ps(_mm256_mul_ps(q, d), m)
                });
                for (o8, v) in o.chunks_exact_mut(8).zip(hadamard32(x)) {
                    store(o8, v);
                }
            }
        }
    }
}

/// Converts the f16 values of `src` into `out`, eight at a time (`out`
/// holds whole groups of eight, `src` at least as many values).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn f16_groups(src: &[u8], out: &mut [f32]) {
    for (o8, b) in out.chunks_exact_mut(8).zip(src.chunks_exact(16)) {
        store(o8, _mm256_cvtph_ps(load16(b)));
    }
}

/// Encodes `src` as f16 into `dst` (two bytes a value), eight values per
/// conversion, rounding to nearest even as the portable encoder
/// (`quant::to_f16`) does, so the same bytes; the last values of a
/// length that is not a multiple of eight go through the portable
/// encoder. A 16-sequence decode step of SmolLM2 spent 41 us per layer
/// writing its rows one conversion call per value, three times what the
/// f32 copy takes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn encode_f16(src: &[f32], dst: &mut [u8]) {
    let whole = src.len() / 8 * 8;
    let (groups, tail) = dst.split_at_mut(2 * whole);
    for (x, o) in src.chunks_exact(8).zip(groups.chunks_exact_mut(16)) {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(load(x));
        let o = &mut o[..16];
        // SAFETY: `o` holds 16 bytes (sliced above) and `storeu` has no
        // alignment requirement.
        unsafe { _mm_storeu_si128(o.as_mut_ptr().cast(), h) };
    }
    encode_portable(KvDtype::F16, &src[whole..], tail);
}

/// Encodes `src` (whole blocks of 32 values) as Q8_0 blocks into `dst`,
/// with the portable quantizer's arithmetic (`q8_0::quantize_block`):
/// the same largest magnitude, scale and reciprocal, each value times the
/// reciprocal rounded half away from zero and clamped to ±127, a value
/// that is not a number stored as 0. So the same bytes, eight values per
/// instruction; a 16-sequence SmolLM2 decode step spent 59 ms per 64 steps
/// writing its rows through the portable one, 2.2 times the f32 copy.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn encode_q8_0(src: &[f32], dst: &mut [u8]) {
    let (blocks, _) = src.as_chunks::<{ q8_0::BLOCK_LEN }>();
    let (outs, _) = dst.as_chunks_mut::<{ q8_0::BLOCK_BYTES }>();
    let sign = _mm256_set1_ps(-0.0);
    // Bytes `4 g..4 g + 4` of a packed block hold values from group
    // `[0, 4, 1, 5, 2, 6, 3, 7][g]` (the packs interleave 128-bit lanes).
    let in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (x, o) in blocks.iter().zip(outs) {
        let v: [__m256; 4] = inline_array::from_fn(|i| load(&x[8 * i..]));
        let mut m = _mm256_setzero_ps();
        for &vi in &v {
            m = _mm256_max_ps(_mm256_andnot_ps(sign, vi), m);
        }
        let mut lanes = [0.0f32; 8];
        store(&mut lanes, m);
        let amax = lanes.iter().fold(0.0f32, |a, &b| a.max(b));
        let d = amax / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        o[..2].copy_from_slice(&to_f16(d).0);
        let id = _mm256_set1_ps(id);
        let q = v.map(|vi| _mm256_cvttps_epi32(rounded_q8(_mm256_mul_ps(vi, id))));
        let words = _mm256_packs_epi32(q[0], q[1]);
        let bytes = _mm256_packs_epi16(words, _mm256_packs_epi32(q[2], q[3]));
        let bytes = _mm256_permutevar8x32_epi32(bytes, in_order);
        let o = &mut o[2..34];
        // SAFETY: `o` holds 32 bytes (sliced above) and `storeu` has no
        // alignment requirement.
        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), bytes) };
    }
}

/// `y` rounded half away from zero (`f32::round`) and clamped to ±127,
/// lanes that are not a number 0: the nearest-even rounding, except that
/// a tie (a fraction of exactly one half, computed exactly) moves away
/// from zero.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn rounded_q8(y: __m256) -> __m256 {
    let sign = _mm256_set1_ps(-0.0);
    let toward_zero = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
    let fraction = _mm256_andnot_ps(sign, _mm256_sub_ps(y, toward_zero));
    let tie = _mm256_cmp_ps::<_CMP_EQ_OQ>(fraction, _mm256_set1_ps(0.5));
    let away = _mm256_add_ps(
        toward_zero,
        _mm256_or_ps(_mm256_set1_ps(1.0), _mm256_and_ps(sign, y)),
    );
    let even = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y);
    let rounded = _mm256_blendv_ps(even, away, tie);
    let not_a_number = _mm256_cmp_ps::<_CMP_UNORD_Q>(y, y);
    let rounded = _mm256_andnot_ps(not_a_number, rounded);
    let rounded = _mm256_max_ps(rounded, _mm256_set1_ps(-127.0));
    _mm256_min_ps(rounded, _mm256_set1_ps(127.0))
}

/// `kv_rows::hadamard32` on four registers of eight values: the same
/// butterflies (`a + b`, `a − b`) stage by stage, then the same scale.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hadamard32(x: [__m256; 4]) -> [__m256; 4] {
    // Strides 1, 2 and 4 inside each register: `t` holds every lane's
    // partner, the low lane of a pair keeps the sum, the high one `low − high`.
    let inner = |r: __m256| {
        let t = _mm256_permute_ps::<0b10_11_00_01>(r);
        let r = _mm256_blend_ps::<0xAA>(_mm256_add_ps(r, t), _mm256_sub_ps(t, r));
        let t = _mm256_permute_ps::<0b01_00_11_10>(r);
        let r = _mm256_blend_ps::<0xCC>(_mm256_add_ps(r, t), _mm256_sub_ps(t, r));
        let t = _mm256_permute2f128_ps::<0x01>(r, r);
        _mm256_blend_ps::<0xF0>(_mm256_add_ps(r, t), _mm256_sub_ps(t, r))
    };
    let [a, b, c, d] = x.map(inner);
    // Stride 8, then 16: whole registers.
    let (a, b, c, d) = (
        _mm256_add_ps(a, b),
        _mm256_sub_ps(a, b),
        _mm256_add_ps(c, d),
        _mm256_sub_ps(c, d),
    );
    let norm = _mm256_set1_ps(1.0 / 32f32.sqrt());
    [
        _mm256_add_ps(a, c),
        _mm256_add_ps(b, d),
        _mm256_sub_ps(a, c),
        _mm256_sub_ps(b, d),
    ]
    .map(|v| _mm256_mul_ps(v, norm))
}

/// The first 16 bytes of `b`.
#[target_feature(enable = "avx2")]
#[inline]
fn load16(b: &[u8]) -> __m128i {
    let b = &b[..16];
    // SAFETY: `b` holds 16 bytes (sliced above) and `loadu` has no
    // alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// The first 8 bytes of `b` in the low half.
#[target_feature(enable = "avx2")]
#[inline]
fn load8(b: &[u8]) -> __m128i {
    let b = &b[..8];
    // SAFETY: `b` holds 8 bytes (sliced above) and `loadl` reads 8 bytes
    // with no alignment requirement.
    unsafe { _mm_loadl_epi64(b.as_ptr().cast()) }
}
