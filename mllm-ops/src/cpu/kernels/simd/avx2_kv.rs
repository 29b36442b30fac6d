//! AVX2 (+ FMA, F16C) decoders of KV-cache rows (see `kv_rows`): eight values per
//! instruction, the same operations as the portable decoder (an exact
//! widening, then one multiply and for Q4_1 one separate add), so the
//! same bits. And the f16 encoder of the rows a step writes, eight values
//! per conversion with the portable encoder's rounding.

use std::arch::x86_64::*;
use std::ops::Range;

use mllm_core::KvDtype;

use super::avx2::{load, store};
use crate::cpu::kernels::kv_rows::{decode_portable, encode_portable};
use crate::quant::{f16_at, q4_1, q8_0};

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
