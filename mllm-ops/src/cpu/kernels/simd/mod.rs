//! SIMD variants of the quantized kernels.
//!
//! * [`avx2`] and [`avx512`]: the f32-activation path (dequantize, f32
//!   tile product), AVX2 + FMA and AVX-512F;
//! * [`avx2_i8`] and [`vnni`]: integer dot products of Q8_0, Q4_0 and Q4_1
//!   weights with 8-bit activations, AVX2 (`maddubs`) and AVX-512 VNNI
//!   (`dpbusd`); [`vnni_i8`]: Q8_0 rows with several 16-bit activation
//!   rows at once (AVX-512 VNNI); [`avx512_i8`]: the activation rows'
//!   16-bit quantizer on 512-bit vectors (`avx2_i8` has AVX2's);
//! * [`avx2_kv`]: decoders of f16, Q8_0 and Q4_1 KV-cache rows and the
//!   f16 and Q8_0 encoders of the rows a step writes (AVX2 + F16C,
//!   bit-exact with the portable ones);
//! * [`vmath`]: vectorized `exp` and SiLU for the softmax and activations;
//! * [`avx2_packed`] and [`vnni_packed`]: Q4 weights repacked in groups of
//!   eight rows times 16-bit activations, AVX2 and AVX-512 VNNI (bit-exact
//!   with each other); [`avx2_packed_q8`] and [`vnni_packed_q8`]: the
//!   same for Q8_0 weights (bit-exact with each other and the portable
//!   kernel); [`avx2_packed_q4k`] and [`vnni_packed_q4k`]: Q4_K weights
//!   in the packed Q4 nibble layout with their super-block scales;
//!   [`avx2_packed_q6k`] and [`vnni_packed_q6k`]: Q6_K weights as packed
//!   nibbles plus a plane of top bits (bit-exact with the portable kernel);
//!   [`avx2_packed_q5`] and [`vnni_packed_q5`]: Q5_0/Q5_1 weights as packed
//!   Q4 nibbles plus a plane of fifth bits; [`avx2_packed_q5k`] and
//!   [`vnni_packed_q5k`]: Q5_K weights, those five-bit blocks under the
//!   packed Q4_K super-block header;
//! * [`amx`]: AMX tile products of 16 activation rows with a packed group
//!   pair's block, and the check that this process may use the tiles;
//!   [`amx_packed`]: the Q4_0/Q4_1, Q5_0/Q5_1 and Q8_0 kernels over them;
//!   [`amx_kquant`] and [`amx_q6k`]: the Q4_K / Q5_K and Q6_K kernels,
//!   with the sub-block scales folded into the weights (all bit-exact
//!   with the AVX-512 ones);
//! * [`avx2_packed_half`] and [`avx512_packed_half`]: f16/bf16 weights
//!   repacked in groups of eight rows, a pair of columns at a time, times f32
//!   activations (bit-exact with each other and the portable kernel);
//! * [`inline_array`]: array maps that are always inlined, for closures
//!   inside kernels (`array::map` leaves them out of line);
//! * [`peak`]: the multiply-add loops that measure the arithmetic peak
//!   (see `kernels::peak`);
//! * [`prefetch`]: software prefetch of the weight streams of the packed
//!   kernels and of the f16/bf16 decode pass, a fixed distance ahead of
//!   what they multiply;
//! * `neon` (aarch64): both paths, the integer one with `sdot` where the
//!   dot-product extension is present.
//!
//! All kernel functions are safe `#[target_feature]` functions; the only ways to
//! reach them are a `QuantKernel` and, for the KV decoders,
//! `avx2_kv::available`, both of which check the CPU first.

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod amx_kquant;
#[cfg(target_arch = "x86_64")]
pub(crate) mod amx_packed;
#[cfg(target_arch = "x86_64")]
pub(crate) mod amx_q6k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_i8;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_kv;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_packed;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_packed_half;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_packed_pair;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_packed_q4k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_packed_q5;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_packed_q5k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_packed_q6k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_packed_q8;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_packed_row;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_i8;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_packed_half;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx_vnni_packed;
#[cfg(target_arch = "x86_64")]
pub(crate) mod inline_array;
#[cfg(target_arch = "x86_64")]
pub(crate) mod kquant_mins;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
#[cfg(target_arch = "x86_64")]
pub(crate) mod peak;
#[cfg(target_arch = "x86_64")]
pub(crate) mod prefetch;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vmath;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni_i8;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni_packed;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni_packed_q4k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni_packed_q5;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni_packed_q5k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni_packed_q6k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni_packed_q8;

/// Activation columns per pass of the tile product, so that the panels of
/// activations and weights being multiplied stay in cache.
pub(crate) const K_CHUNK: usize = 256;

/// Runs `$body` once for each activation row `$t` of a tile of `$rows`
/// (at most [`TILE_TOKENS`](crate::cpu::kernels::packed::TILE_TOKENS)),
/// with `$t` a constant: the steps are spelled out rather than looped, so
/// that per-row arrays indexed by `$t` stay in registers (a loop the
/// compiler does not unroll keeps them in a stack array indexed at run
/// time). The x86-64 packed kernels use it.
#[cfg(target_arch = "x86_64")]
macro_rules! per_row {
    ($rows:expr, |$t:ident| $body:block) => {
        $crate::cpu::kernels::simd::per_row!($rows, |$t| $body, [0, 1, 2, 3]);
    };
    ($rows:expr, |$t:ident| $body:block, [$($row:literal),*]) => {
        const _: () = assert!(
            $crate::cpu::kernels::packed::TILE_TOKENS <= [$($row),*].len()
        );
        debug_assert!($rows <= [$($row),*].len());
        $(
            if $row < $rows {
                let $t = $row;
                $body
            }
        )*
    };
}

#[cfg(target_arch = "x86_64")]
pub(crate) use per_row;

/// Defines `dequantize_row` for an ISA module from its block decoders, one
/// per [`QuantType`](crate::quant::QuantType) and named after the format's
/// module (`decode_q8_0`, `decode_q4_k`, …), each writing one block's
/// values: the row's blocks are decoded in order. A new block type is a
/// decoder in each ISA module and one arm here.
macro_rules! dequantize_row {
    ($features:literal) => {
        /// Dequantizes a row of blocks into `out` (bit-exact with
        /// [`crate::quant::dequantize`]).
        #[target_feature(enable = $features)]
        pub(crate) fn dequantize_row(qt: QuantType, w: &[u8], out: &mut [f32]) {
            use super::each_block as each;
            match qt {
                QuantType::Q8_0 => each(w, out, |b, o| decode_q8_0(b, o)),
                QuantType::Q4_0 => each(w, out, |b, o| decode_q4_0(b, o)),
                QuantType::Q4_1 => each(w, out, |b, o| decode_q4_1(b, o)),
                QuantType::Q5_0 => each(w, out, |b, o| decode_q5_0(b, o)),
                QuantType::Q5_1 => each(w, out, |b, o| decode_q5_1(b, o)),
                QuantType::Q2K => each(w, out, |b, o| decode_q2_k(b, o)),
                QuantType::Q3K => each(w, out, |b, o| decode_q3_k(b, o)),
                QuantType::Q4K => each(w, out, |b, o| decode_q4_k(b, o)),
                QuantType::Q5K => each(w, out, |b, o| decode_q5_k(b, o)),
                QuantType::Q6K => each(w, out, |b, o| decode_q6_k(b, o)),
                QuantType::IQ4NL => each(w, out, |b, o| decode_iq4_nl(b, o)),
                QuantType::IQ4XS => each(w, out, |b, o| decode_iq4_xs(b, o)),
            }
        }
    };
}

pub(crate) use dequantize_row;

/// Calls `decode` on every (block bytes, block values) pair of a row: the
/// driver of every ISA's `dequantize_row`.
#[inline(always)]
pub(crate) fn each_block<const B: usize, const N: usize>(
    w: &[u8],
    out: &mut [f32],
    mut decode: impl FnMut(&[u8; B], &mut [f32; N]),
) {
    let (blocks, _) = w.as_chunks::<B>();
    let (outs, _) = out.as_chunks_mut::<N>();
    for (b, o) in blocks.iter().zip(outs) {
        decode(b, o);
    }
}

/// Adds columns `full..k` of every product, one by one, to `res`, the
/// products over columns `0..full` (whole lane groups): the tail of the
/// float linear layer's micro-kernels, the same for every ISA.
#[inline(always)]
pub(crate) fn add_tails<const R: usize, const C: usize, T: Copy>(
    res: &mut [[f32; C]; R],
    xs: [&[f32]; R],
    ws: [&[T]; C],
    (full, k): (usize, usize),
    to_f32: impl Fn(T) -> f32,
) {
    for (x, row) in xs.iter().zip(res.iter_mut()) {
        for (w, out) in ws.iter().zip(row.iter_mut()) {
            let mut tail = 0.0f32;
            for i in full..k {
                tail += x[i] * to_f32(w[i]);
            }
            *out += tail;
        }
    }
}

/// Defines `gemm_tile` for an ISA module from its `micro::<R, C>` kernel:
/// `dst[o·nr + t] = Σ_i xb[t·k + i] · wb[o·k + i]` for `nr` activation rows
/// and `no` weight rows of length `k` (a multiple of the lane count).
macro_rules! tile_gemm {
    ($features:literal, $micro:ident, $lanes:expr) => {
        /// Accumulates `R` activation rows (from `t`) times every weight
        /// row into `dst`, over columns `k0..k0 + kc`.
        #[target_feature(enable = $features)]
        #[inline]
        #[allow(clippy::too_many_arguments)]
        fn rows_pass<const R: usize>(
            xb: &[f32],
            t: usize,
            nr: usize,
            wb: &[f32],
            no: usize,
            (k, k0, kc): (usize, usize, usize),
            dst: &mut [f32],
        ) {
            let mut xs: [&[f32]; R] = [&[]; R];
            for (r, x) in xs.iter_mut().enumerate() {
                *x = &xb[(t + r) * k + k0..][..kc];
            }
            let mut o = 0;
            while o + 4 <= no {
                let mut ws: [&[f32]; 4] = [&[]; 4];
                for (c, w) in ws.iter_mut().enumerate() {
                    *w = &wb[(o + c) * k + k0..][..kc];
                }
                let res = $micro::<R, 4>(xs, ws, kc);
                for (r, row) in res.iter().enumerate() {
                    for (c, &v) in row.iter().enumerate() {
                        dst[(o + c) * nr + t + r] += v;
                    }
                }
                o += 4;
            }
            while o < no {
                let res = $micro::<R, 1>(xs, [&wb[o * k + k0..][..kc]], kc);
                for (r, row) in res.iter().enumerate() {
                    dst[o * nr + t + r] += row[0];
                }
                o += 1;
            }
        }

        /// `dst[o·nr + t] = Σ_i xb[t·k + i] · wb[o·k + i]` (`dst` is
        /// `[no, nr]`), register-blocked three activation rows by four
        /// weight rows, in column chunks of [`K_CHUNK`](super::K_CHUNK).
        #[target_feature(enable = $features)]
        pub(crate) fn gemm_tile(
            xb: &[f32],
            nr: usize,
            k: usize,
            wb: &[f32],
            no: usize,
            dst: &mut [f32],
        ) {
            debug_assert_eq!(k % $lanes, 0);
            dst.fill(0.0);
            let mut k0 = 0;
            while k0 < k {
                let kc = super::K_CHUNK.min(k - k0);
                let mut t = 0;
                while t + 3 <= nr {
                    rows_pass::<3>(xb, t, nr, wb, no, (k, k0, kc), dst);
                    t += 3;
                }
                match nr - t {
                    2 => rows_pass::<2>(xb, t, nr, wb, no, (k, k0, kc), dst),
                    1 => rows_pass::<1>(xb, t, nr, wb, no, (k, k0, kc), dst),
                    _ => {}
                }
                k0 += kc;
            }
        }
    };
}

pub(crate) use tile_gemm;
