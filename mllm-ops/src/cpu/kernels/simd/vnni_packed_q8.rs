//! AVX-512 VNNI product of a packed Q8_0 row group (see `packed_q8`) with
//! one to four activation rows (16-bit planes split at `NARROW`, or 8-bit
//! ones, `BYTE`, whose zero low plane is skipped), on 256-bit vectors
//! (AVX-512VL), and of
//! two consecutive groups at once on 512-bit vectors (`pair_dot`: the
//! 256-bit work in each half, so the same bits) for one to eight rows
//! (`Q8Format::PAIR_TILE_TOKENS`: eight rows per tile ran the products of
//! one thread 1.07x faster than four with 8-bit rows, 1.08x with 16-bit
//! ones).
//!
//! `dpbusd` multiplies unsigned by signed bytes. The low plane (`0..=127`)
//! is the unsigned side against the signed weights as they are; for the
//! signed high plane the weights are offset to `w + 128` (one `xor` per
//! chunk) and `128 · Σ hi` (`Q8Input::hi_offsets`, made once per call)
//! is subtracted from the block sum. The 32-bit sums are then the
//! integers of `avx2_packed_q8`, followed by the same float steps, so the
//! results equal it bit for bit.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA, F16C, AVX-512F, AVX-512VL,
//! AVX-512BW and AVX-512 VNNI (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use super::avx2_i8::load32;
use super::inline_array::from_fn;
use super::vnni_packed::{dpbusd_word, f16x16, join, store_pair, word16};
use crate::cpu::kernels::packed::{WeightReads, GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::packed_q8::{Q8Input, Q8_PACKED_BLOCK_BYTES};
use crate::cpu::kernels::qact::{BLOCK, BYTE, NARROW};

/// Defines `tile::<SHIFT, T>`, the eight outputs of one packed group for
/// `T` activation rows, with the target features `$features` and the
/// 256-bit `dpbusd` intrinsic `$dpbusd` (AVX-512VL's here, AVX-VNNI's in
/// `avx_vnni_packed`). Like every one-group tile it prefetches the weights
/// it reads from memory ahead into L2 and, for several rows, each block
/// into L1.
macro_rules! q8_tile {
    ($features:literal, $dpbusd:path) => {
        /// The eight outputs of one packed group for `T` activation rows.
        #[target_feature(enable = $features)]
        #[inline]
        fn tile<const SHIFT: u32, const T: usize>(
            group: &[u8],
            xs: &[Q8Input<'_, SHIFT>],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) -> [__m256; T] {
            use $crate::cpu::kernels::packed_q8::Q8_PACKED_BLOCK_BYTES;
            use $crate::cpu::kernels::qact::{BLOCK, BYTE};
            use $crate::cpu::kernels::simd::avx2_i8::load32;
            use $crate::cpu::kernels::simd::avx2_packed::word;
            use $crate::cpu::kernels::simd::avx2_packed_q8::{add_block, scales};
            use $crate::cpu::kernels::simd::inline_array::from_fn;
            // As in `pair_tile` (at the AVX-VNNI level 1.07x with 8-bit rows).
            let nb = xs[0].x.d.len();
            let his: [_; T] = from_fn(|t| &xs[t].x.hi.as_chunks::<BLOCK>().0[..nb]);
            let los: [_; T] = from_fn(|t| &xs[t].x.lo.as_chunks::<BLOCK>().0[..nb]);
            let ds: [_; T] = from_fn(|t| &xs[t].x.d[..nb]);
            let hi_offsets: [_; T] = from_fn(|t| &xs[t].hi_offsets[..nb]);
            let offset = _mm256_set1_epi8(i8::MIN);
            let mut acc = [_mm256_setzero_ps(); T];
            let blocks = group[..nb * Q8_PACKED_BLOCK_BYTES]
                .as_chunks::<Q8_PACKED_BLOCK_BYTES>()
                .0;
            let mut ahead = $crate::cpu::kernels::simd::prefetch::Streams::new(group, 1, reads);
            for (i, blk) in blocks.iter().enumerate() {
                ahead.next(Q8_PACKED_BLOCK_BYTES);
                $crate::cpu::kernels::simd::prefetch::block_into_l1(blk, Q8_PACKED_BLOCK_BYTES);
                let mut sum_hi = [_mm256_setzero_si256(); T];
                let mut sum_lo = [_mm256_setzero_si256(); T];
                for j in 0..BLOCK / 4 {
                    let w = load32(&blk[16 + 32 * j..]);
                    let w_offset = _mm256_xor_si256(w, offset);
                    for t in 0..T {
                        sum_hi[t] = $dpbusd(sum_hi[t], w_offset, word(&his[t][i], 4 * j));
                        if SHIFT != BYTE {
                            sum_lo[t] = $dpbusd(sum_lo[t], word(&los[t][i], 4 * j), w);
                        }
                    }
                }
                let d = scales(blk);
                for t in 0..T {
                    let correction = _mm256_set1_epi32(hi_offsets[t][i]);
                    let hi = _mm256_sub_epi32(sum_hi[t], correction);
                    acc[t] = add_block::<SHIFT>(acc[t], d, hi, sum_lo[t], ds[t][i]);
                }
            }
            acc
        }
    };
}

pub(crate) use q8_tile;

q8_tile!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    _mm256_dpbusd_epi32
);

super::avx2_packed::packed_group_dot!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    [const SHIFT: u32],
    Q8Input<'_, SHIFT>
);

/// The outputs of two consecutive packed groups `a` and `b` for `T`
/// activation rows at once, on 512-bit vectors: lanes 0..8 of each result
/// are `a`'s eight rows, lanes 8..16 `b`'s. Lane by lane the same integer
/// and float steps as `tile`, so the same bits.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn pair_tile<const SHIFT: u32, const T: usize>(
    a: &[u8],
    b: &[u8],
    xs: &[Q8Input<'_, SHIFT>],
    reads: WeightReads,
) -> [__m512; T] {
    // The slices of each row, not copies of the inputs (wide loads of the
    // copies' narrow stores stalled each call's start), by forced-inline
    // maps (see `inline_array`): with `std::array::from_fn` the closures
    // stayed calls, and one thread's products ran 1.2x slower with 8-bit
    // rows, 1.1x with 16-bit ones.
    let nb = xs[0].x.d.len();
    let his: [_; T] = from_fn(|t| &xs[t].x.hi.as_chunks::<BLOCK>().0[..nb]);
    let los: [_; T] = from_fn(|t| &xs[t].x.lo.as_chunks::<BLOCK>().0[..nb]);
    let ds: [_; T] = from_fn(|t| &xs[t].x.d[..nb]);
    let hi_offsets: [_; T] = from_fn(|t| &xs[t].hi_offsets[..nb]);
    let offset = _mm512_set1_epi8(i8::MIN);
    let mut acc = [_mm512_setzero_ps(); T];
    let blocks_a = a[..nb * Q8_PACKED_BLOCK_BYTES]
        .as_chunks::<Q8_PACKED_BLOCK_BYTES>()
        .0;
    let blocks_b = b[..nb * Q8_PACKED_BLOCK_BYTES]
        .as_chunks::<Q8_PACKED_BLOCK_BYTES>()
        .0;
    let mut ahead = super::prefetch::Streams::new(a, 2, reads);
    for (i, (ka, kb)) in blocks_a.iter().zip(blocks_b).enumerate() {
        ahead.next(Q8_PACKED_BLOCK_BYTES);
        super::prefetch::block_into_l1(ka, Q8_PACKED_BLOCK_BYTES);
        super::prefetch::block_into_l1(kb, Q8_PACKED_BLOCK_BYTES);
        let mut sum_hi = [_mm512_setzero_si512(); T];
        let mut sum_lo = [_mm512_setzero_si512(); T];
        for j in 0..BLOCK / 4 {
            let at = 16 + 32 * j;
            let w = join(load32(&ka[at..]), load32(&kb[at..]));
            let w_offset = _mm512_xor_si512(w, offset);
            for t in 0..T {
                sum_hi[t] = dpbusd_word::<T>(sum_hi[t], w_offset, &his[t][i], 4 * j);
                if SHIFT != BYTE {
                    sum_lo[t] = _mm512_dpbusd_epi32(sum_lo[t], word16::<T>(&los[t][i], 4 * j), w);
                }
            }
        }
        let d = f16x16(&ka[..16], &kb[..16]);
        for t in 0..T {
            let correction = _mm512_set1_epi32(hi_offsets[t][i]);
            let hi = _mm512_sub_epi32(sum_hi[t], correction);
            let p = if SHIFT == BYTE {
                hi
            } else {
                _mm512_add_epi32(_mm512_slli_epi32::<{ NARROW }>(hi), sum_lo[t])
            };
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(ds[t][i]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[t]);
        }
    }
    acc
}

super::vnni_packed::packed_pair_dot!([const SHIFT: u32], Q8Input<'_, SHIFT>, wide);
