//! The AVX-512 quantizer of activation rows into 16-bit values split in
//! two byte planes (`qact::quantize_q16_into`), 32 values per pair of
//! 512-bit vectors: the same operations as AVX2's `quantize_row_q16` lane
//! for lane, so the same planes, scales and sums.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX-512F and AVX-512BW (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx512::{load, LANES};
use crate::cpu::kernels::qact::{q16_max, q16_scale, BlockScales, BLOCK, WIDE};

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
/// does. With one scale per block, the blocks go 16 at a time (see
/// [`quantize_run`]) and the last ones one by one; with a scale per
/// K-quant super-block, each scale's largest magnitude comes from one
/// running maximum and one reduction, not one per block.
#[target_feature(enable = "avx512f,avx512bw")]
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
        let amax = xc.chunks_exact(LANES).fold(_mm512_setzero_ps(), |m, v| {
            _mm512_max_ps(m, _mm512_abs_ps(load(v)))
        });
        let (dv, id) = q16_scale::<SHIFT>(_mm512_reduce_max_ps(amax));
        let id = _mm512_set1_ps(id);
        for (i, xb) in xc.as_chunks::<BLOCK>().0.iter().enumerate() {
            let b = first + c * per_scale / BLOCK + i;
            let q = quantize_block(xb, id);
            store_planes::<SHIFT>(q, &mut hi[b * BLOCK..], &mut lo[b * BLOCK..]);
            let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
            scales.set(b, dv, sum);
        }
    }
}

/// A block's 32 values (`xb`) times `id`, rounded to the nearest integer.
#[target_feature(enable = "avx512f")]
#[inline]
fn quantize_block(xb: &[f32; BLOCK], id: __m512) -> [__m512i; 2] {
    std::array::from_fn(|j| {
        let v = _mm512_mul_ps(load(&xb[LANES * j..]), id);
        _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)
    })
}

/// Splits a block's 32 quantized values into its planes (`hi = (q +
/// round) >> SHIFT`, `lo = q − (hi << SHIFT)`), stored at the start of
/// `hi` and `lo`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn store_planes<const SHIFT: u32>(q: [__m512i; 2], hi: &mut [i8], lo: &mut [i8]) {
    let round = _mm512_set1_epi32(if SHIFT == WIDE { 128 } else { 0 });
    let h = q.map(|q| _mm512_srai_epi32::<SHIFT>(_mm512_add_epi32(q, round)));
    let l: [__m512i; 2] =
        std::array::from_fn(|i| _mm512_sub_epi32(q[i], _mm512_slli_epi32::<SHIFT>(h[i])));
    store_bytes(hi, h);
    store_bytes(lo, l);
}

/// Blocks that [`quantize_run`] quantizes at once: one per lane.
const RUN_BLOCKS: usize = LANES;

/// Values of a [`quantize_run`].
const RUN_VALUES: usize = RUN_BLOCKS * BLOCK;

/// `quantize_row_q16` with one scale per block, for the 16 blocks of
/// `run` (the row's blocks `first..first + 16`): each block's largest
/// magnitude and sum end in one lane of a vector by a transposing
/// reduction of all 16 blocks' vectors, and the scales come from one
/// division of 16 lanes (the same correctly rounded divisions as
/// `q16_scale`'s, so the same bits), not one reduction and one scalar
/// division per block. (Runs of fewer blocks, zeros in the other lanes,
/// were slower than the block-by-block loop for a row's last blocks.)
#[target_feature(enable = "avx512f,avx512bw")]
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
        std::array::from_fn(|j| {
            let [a, b] = [0, LANES].map(|at| _mm512_abs_ps(load(&blocks[j][at..])));
            _mm512_castps_si512(_mm512_max_ps(a, b))
        }),
        |a, b| {
            _mm512_castps_si512(_mm512_max_ps(
                _mm512_castsi512_ps(a),
                _mm512_castsi512_ps(b),
            ))
        },
    );
    let d = _mm512_div_ps(_mm512_castsi512_ps(amax), _mm512_set1_ps(q16_max(SHIFT)));
    let nonzero = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(d, _mm512_setzero_ps());
    let mut ids = [0.0f32; RUN_BLOCKS];
    let id = _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(1.0), d);
    store_lanes(&mut ids, _mm512_castps_si512(id));
    let sums = transpose_reduce(
        std::array::from_fn(|j| {
            let b = first + j;
            let q = quantize_block(&blocks[j], _mm512_set1_ps(ids[j]));
            store_planes::<SHIFT>(q, &mut hi[b * BLOCK..], &mut lo[b * BLOCK..]);
            _mm512_add_epi32(q[0], q[1])
        }),
        |a, b| _mm512_add_epi32(a, b),
    );
    let s = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sums));
    store_lanes(&mut scales.d[first..], _mm512_castps_si512(d));
    store_lanes(&mut scales.s[first..], _mm512_castps_si512(s));
    store_lanes(&mut scales.sums[first..], sums);
}

/// Lane `j` of the result is `op` over the 16 lanes of `v[j]` (`op`
/// associative and commutative on 32-bit lanes): four rounds of pairing
/// vectors, each round halving their number and the lanes each still
/// spans.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose_reduce(v: [__m512i; 16], op: impl Fn(__m512i, __m512i) -> __m512i) -> __m512i {
    // Within 128-bit lanes: `a`'s partial results to even 32-bit places,
    // `b`'s to odd ones.
    let v: [__m512i; 8] = std::array::from_fn(|k| {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        op(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
    });
    // Within 128-bit lanes: one 32-bit place per vector of four.
    let v: [__m512i; 4] = std::array::from_fn(|k| {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        op(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
    });
    // Across 128-bit lanes: each vector of eight over two of them.
    let v: [__m512i; 2] = std::array::from_fn(|k| {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        op(
            _mm512_shuffle_i32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(a, b),
        )
    });
    op(
        _mm512_shuffle_i32x4::<0b10_00_10_00>(v[0], v[1]),
        _mm512_shuffle_i32x4::<0b11_01_11_01>(v[0], v[1]),
    )
}

/// Stores the 16 32-bit lanes of `v` at the start of `out`.
#[target_feature(enable = "avx512f")]
#[inline]
fn store_lanes<T: Copy>(out: &mut [T], v: __m512i) {
    const { assert!(std::mem::size_of::<T>() == 4, "32-bit lanes") };
    let out = &mut out[..LANES];
    // SAFETY: `out` holds 16 values of 4 bytes each (sliced above, their
    // size checked at compile time) and `storeu` has no alignment
    // requirement.
    unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), v) };
}
