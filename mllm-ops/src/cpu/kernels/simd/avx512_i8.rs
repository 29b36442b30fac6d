//! The AVX-512 quantizer of activation rows into 16-bit values split in
//! two byte planes (`qact::quantize_q16_into`), 32 values per pair of
//! 512-bit vectors: the same operations as AVX2's `quantize_row_q16` lane
//! for lane, so the same planes, scales and sums.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX-512F and AVX-512BW (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx512::{load, LANES};
use crate::cpu::kernels::qact::{q16_scale, BlockScales, BLOCK, WIDE};

/// Saturates the 32 values of `v` to bytes and stores them at the start
/// of `dst`, as AVX2's two signed packs do.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn store_bytes(dst: &mut [i8], v: [__m512i; 2]) {
    let dst = &mut dst[..BLOCK];
    for (half, v) in dst.chunks_exact_mut(LANES).zip(v) {
        // SAFETY: `half` holds 16 bytes (sliced above) and `storeu` has no
        // alignment requirement.
        unsafe { _mm_storeu_si128(half.as_mut_ptr().cast(), _mm512_cvtsepi32_epi8(v)) };
    }
}

/// Quantizes `x` into 16-bit values stored as two planes split at `SHIFT`
/// bits, one scale per `per_scale` values (a multiple of 32 that divides
/// the length of `x`), exactly as the scalar `qact::quantize_q16_into`
/// does. Each scale's largest magnitude comes from one running maximum
/// and one reduction per scale, not one per block.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn quantize_row_q16<const SHIFT: u32>(
    x: &[f32],
    hi: &mut [i8],
    lo: &mut [i8],
    mut scales: BlockScales<'_>,
    per_scale: usize,
) {
    // `hi = (q + round) >> SHIFT`, `lo = q − (hi << SHIFT)`.
    let round = _mm512_set1_epi32(if SHIFT == WIDE { 128 } else { 0 });
    for (c, xc) in x.chunks_exact(per_scale).enumerate() {
        let amax = xc.chunks_exact(LANES).fold(_mm512_setzero_ps(), |m, v| {
            _mm512_max_ps(m, _mm512_abs_ps(load(v)))
        });
        let (dv, id) = q16_scale::<SHIFT>(_mm512_reduce_max_ps(amax));
        let id = _mm512_set1_ps(id);
        for (i, xb) in xc.chunks_exact(BLOCK).enumerate() {
            let b = c * per_scale / BLOCK + i;
            let q: [__m512i; 2] = std::array::from_fn(|j| {
                let v = _mm512_mul_ps(load(&xb[LANES * j..]), id);
                _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)
            });
            let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
            let h = q.map(|q| _mm512_srai_epi32::<SHIFT>(_mm512_add_epi32(q, round)));
            let l: [__m512i; 2] =
                std::array::from_fn(|j| _mm512_sub_epi32(q[j], _mm512_slli_epi32::<SHIFT>(h[j])));
            store_bytes(&mut hi[b * BLOCK..], h);
            store_bytes(&mut lo[b * BLOCK..], l);
            scales.set(b, dv, sum);
        }
    }
}
