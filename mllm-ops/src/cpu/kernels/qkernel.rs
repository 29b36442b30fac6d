//! The choice of quantized-kernel variant: activation path and instruction
//! set, checked against the CPU at run time and then dispatched per row.

use super::packed::{PackedFormat, WeightReads};
use super::qact::{self, BlockScales, Int8Type, Q16Act, Q16Row, Q8Act, Q8Row};
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::simd;
use super::{packed, qdot};
use crate::quant::QuantType;

/// How a linear layer with quantized weights treats its activations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QuantPath {
    /// Multiply the (exactly) dequantized weights with the f32 activations:
    /// the accurate path, and the default.
    #[default]
    F32Activations,
    /// For steps with one activation row (decode) and Q8_0, Q4_0 or Q4_1
    /// weights, quantize the row to 8 bits per block of 32 and use integer
    /// dot products: faster (about 20–25 % for a 4096 × 4096 Q4_0 layer with
    /// AVX2) but adds the activations' rounding error (about 0.4 % of each
    /// value). Steps with several rows and K-quant weights use the f32 path,
    /// whose dequantized tiles beat per-row integer dot products there.
    Int8Activations,
    /// As [`QuantPath::Int8Activations`] with the row quantized to 16 bits
    /// (two 8-bit planes, two byte dot products per block): 1/128 of the
    /// 8-bit rounding error (logits within about 1e-4 of the f32 path), and
    /// still about twice as fast as the f32 path on AVX2. The default of
    /// the linear op.
    Int16Activations,
    /// As [`QuantPath::Int16Activations`], except that the repacked
    /// weights (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q8_0) take their
    /// activation rows at 8 bits per block of 32, as llama.cpp's kernels
    /// do: one byte product per weight instead of two, so prefill through
    /// them runs 1.2-1.8x faster, with the 8-bit path's rounding error on
    /// those layers. Each row's result still does not depend on the batch.
    Int8Packed,
}

impl QuantPath {
    /// Whether Q8_0 / Q4 / Q5 weights repack for the packed kernels and
    /// take 16-bit rows in the row-by-row integer ones: every integer path
    /// but the 8-bit one.
    pub fn is_16_bit(self) -> bool {
        matches!(self, QuantPath::Int16Activations | QuantPath::Int8Packed)
    }
}

/// The instruction set a quantized kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimdLevel {
    /// Portable scalar code.
    Scalar,
    /// AVX2, FMA and F16C (x86-64).
    Avx2,
    /// AVX2, FMA and F16C with AVX-VNNI, the 256-bit `vpdpbusd` of CPUs
    /// without AVX-512 (Intel's since Alder Lake): the packed integer
    /// kernels' byte products in one instruction instead of three; every
    /// other kernel is AVX2's. Integer paths only (x86-64).
    AvxVnni,
    /// AVX-512F, and for the integer paths also AVX-512BW, AVX-512VL and
    /// AVX-512 VNNI (x86-64).
    Avx512,
    /// [`SimdLevel::Avx512`] with AMX tiles (8-bit products), which this
    /// process may use: the packed Q4_0/Q4_1, Q5_0/Q5_1, Q8_0, Q4_K and
    /// Q5_K kernels multiply 16 activation rows at a time on tiles, with
    /// the same results; every other kernel is AVX-512's. Integer paths
    /// only (x86-64, Linux).
    Amx,
    /// NEON (aarch64); [`QuantPath::Int8Activations`] also uses the
    /// dot-product extension (`sdot`) where the CPU has it.
    Neon,
}

impl SimdLevel {
    /// The name that `SimdLevel::from_str` reads and `Display` writes.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::AvxVnni => "avxvnni",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Amx => "amx",
            SimdLevel::Neon => "neon",
        }
    }

    /// Every level, fastest first.
    pub const FASTEST_FIRST: [SimdLevel; 6] = [
        SimdLevel::Amx,
        SimdLevel::Avx512,
        SimdLevel::AvxVnni,
        SimdLevel::Avx2,
        SimdLevel::Neon,
        SimdLevel::Scalar,
    ];

    /// Whether this level is `max` or a slower one (after it in
    /// [`SimdLevel::FASTEST_FIRST`]): what a run capped at `max` may use.
    pub fn at_most(self, max: SimdLevel) -> bool {
        let rank = |level| Self::FASTEST_FIRST.iter().position(|&l| l == level);
        rank(self) >= rank(max)
    }

    /// Whether this CPU runs `path`'s kernels at this level.
    pub fn is_available(self, path: QuantPath) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::AvxVnni => {
                path != QuantPath::F32Activations
                    && SimdLevel::Avx2.is_available(path)
                    && is_x86_feature_detected!("avxvnni")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => {
                SimdLevel::Avx2.is_available(path)
                    && is_x86_feature_detected!("avx512f")
                    && (path == QuantPath::F32Activations
                        || (is_x86_feature_detected!("avx512bw")
                            && is_x86_feature_detected!("avx512vl")
                            && is_x86_feature_detected!("avx512vnni")))
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Amx => {
                path != QuantPath::F32Activations
                    && SimdLevel::Avx512.is_available(path)
                    && simd::amx::tiles_available()
            }
            #[cfg(not(target_arch = "x86_64"))]
            SimdLevel::Avx2 | SimdLevel::AvxVnni | SimdLevel::Avx512 | SimdLevel::Amx => false,
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => {
                // Both paths need only NEON: the int8 kernel picks its
                // variant by the dot-product extension when it runs.
                let _ = path;
                std::arch::is_aarch64_feature_detected!("neon")
            }
            #[cfg(not(target_arch = "aarch64"))]
            SimdLevel::Neon => false,
        }
    }

    /// Whether this is an x86-64 level, each of which includes AVX2, FMA
    /// and F16C (so that its kernels may run AVX2's where they have none of
    /// their own).
    pub fn includes_avx2(self) -> bool {
        matches!(
            self,
            SimdLevel::Avx2 | SimdLevel::AvxVnni | SimdLevel::Avx512 | SimdLevel::Amx
        )
    }
}

impl std::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

impl std::str::FromStr for SimdLevel {
    type Err = String;

    /// `avx512`, `avxvnni`, `avx2`, `neon` or `scalar`, any case.
    fn from_str(s: &str) -> Result<Self, String> {
        SimdLevel::FASTEST_FIRST
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names = SimdLevel::FASTEST_FIRST.map(SimdLevel::name);
                format!(
                    "unknown SIMD level '{s}': expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// A quantized-kernel variant: a [`QuantPath`] and a [`SimdLevel`] that this
/// CPU supports for it. Choose one when a layer is created and keep it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantKernel {
    path: QuantPath,
    /// Invariant: `level.is_available(path)`.
    level: SimdLevel,
}

impl QuantKernel {
    /// The fastest variant of `path` on this CPU.
    pub fn new(path: QuantPath) -> QuantKernel {
        QuantKernel::capped(path, SimdLevel::FASTEST_FIRST[0])
    }

    /// The fastest variant of `path` on this CPU among `max` and the levels
    /// after it in [`SimdLevel::FASTEST_FIRST`]: `capped(path, Avx2)` runs
    /// AVX2 kernels on a CPU with AVX-512 (how an AVX2-only CPU is
    /// benchmarked on one that has both), `capped(path, Scalar)` the
    /// portable ones.
    pub fn capped(path: QuantPath, max: SimdLevel) -> QuantKernel {
        let level = SimdLevel::FASTEST_FIRST
            .into_iter()
            .find(|l| l.at_most(max) && l.is_available(path))
            .unwrap_or(SimdLevel::Scalar);
        QuantKernel { path, level }
    }

    /// `path` at `level`, or `None` when this CPU lacks the level's features.
    pub fn with_level(path: QuantPath, level: SimdLevel) -> Option<QuantKernel> {
        level
            .is_available(path)
            .then_some(QuantKernel { path, level })
    }

    /// The activation path.
    pub fn path(self) -> QuantPath {
        self.path
    }

    /// The instruction set.
    pub fn level(self) -> SimdLevel {
        self.level
    }

    /// Dequantizes consecutive `qt` blocks into `out` (bit-exact at every
    /// level).
    pub(crate) fn dequantize_row(self, qt: QuantType, w: &[u8], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        match self.level {
            // SAFETY: the level is available (struct invariant): AVX-512F,
            // AVX2 and FMA were detected.
            SimdLevel::Avx512 | SimdLevel::Amx => {
                return unsafe { simd::avx512::dequantize_row(qt, w, out) }
            }
            // SAFETY: the level is available: AVX2 and FMA were detected.
            SimdLevel::Avx2 | SimdLevel::AvxVnni => {
                return unsafe { simd::avx2::dequantize_row(qt, w, out) }
            }
            SimdLevel::Scalar | SimdLevel::Neon => {}
        }
        #[cfg(target_arch = "aarch64")]
        if self.level == SimdLevel::Neon {
            // SAFETY: the level is available (struct invariant): NEON was
            // detected.
            return unsafe { simd::neon::dequantize_row(qt, w, out) };
        }
        qt.dequantize_blocks(w, out);
    }

    /// `dst[o·nr + t] = Σ_i xb[t·k + i] · wb[o·k + i]` for `nr` activation
    /// rows and `no` f32 weight rows of length `k` (a multiple of 32).
    pub(crate) fn gemm_tile(
        self,
        xb: &[f32],
        nr: usize,
        k: usize,
        wb: &[f32],
        no: usize,
        dst: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        match self.level {
            // SAFETY: the level is available (struct invariant): AVX-512F,
            // AVX2 and FMA were detected.
            SimdLevel::Avx512 | SimdLevel::Amx => {
                return unsafe { simd::avx512::gemm_tile(xb, nr, k, wb, no, dst) }
            }
            // SAFETY: the level is available: AVX2 and FMA were detected.
            SimdLevel::Avx2 | SimdLevel::AvxVnni => {
                return unsafe { simd::avx2::gemm_tile(xb, nr, k, wb, no, dst) }
            }
            SimdLevel::Scalar | SimdLevel::Neon => {}
        }
        #[cfg(target_arch = "aarch64")]
        if self.level == SimdLevel::Neon {
            // SAFETY: the level is available (struct invariant): NEON was
            // detected.
            return unsafe { simd::neon::gemm_tile(xb, nr, k, wb, no, dst) };
        }
        qdot::gemm_tile(xb, nr, k, wb, no, dst);
    }

    /// The integer dot product of a weight row with a quantized activation
    /// row (see `qact::dot_i8`).
    pub(crate) fn dot_i8(self, it: Int8Type, w: &[u8], x: Q8Row<'_>) -> f32 {
        #[cfg(target_arch = "x86_64")]
        match self.level {
            SimdLevel::Avx512 | SimdLevel::Amx if self.path == QuantPath::Int8Activations => {
                // SAFETY: AVX-512 is available for the int8 path (struct
                // invariant): AVX2, FMA, AVX-512F/BW and VNNI were detected.
                return unsafe { simd::vnni::dot_i8(it, w, x) };
            }
            SimdLevel::Amx | SimdLevel::Avx512 | SimdLevel::AvxVnni | SimdLevel::Avx2 => {
                // SAFETY: every x86 level includes AVX2 and FMA, detected when
                // the kernel was made.
                return unsafe { simd::avx2_i8::dot_i8(it, w, x) };
            }
            SimdLevel::Scalar | SimdLevel::Neon => {}
        }
        #[cfg(target_arch = "aarch64")]
        if self.level == SimdLevel::Neon {
            // SAFETY: the level is available (struct invariant): NEON was
            // detected; the kernel checks the dot-product extension itself.
            return unsafe { simd::neon::dot_i8(it, w, x) };
        }
        qact::dot_i8(it, w, x)
    }

    /// [`QuantKernel::dot_i8`] of four weight rows with one activation row.
    pub(crate) fn dot_i8_rows(self, it: Int8Type, w: [&[u8]; 4], x: Q8Row<'_>) -> [f32; 4] {
        #[cfg(target_arch = "x86_64")]
        match self.level {
            SimdLevel::Avx512 | SimdLevel::Amx if self.path == QuantPath::Int8Activations => {
                return w.map(|w| self.dot_i8(it, w, x));
            }
            SimdLevel::Amx | SimdLevel::Avx512 | SimdLevel::AvxVnni | SimdLevel::Avx2 => {
                // SAFETY: every x86 level includes AVX2, FMA and F16C,
                // detected when the kernel was made.
                return unsafe { simd::avx2_i8::dot_i8_rows(it, w, x) };
            }
            _ => {}
        }
        w.map(|w| self.dot_i8(it, w, x))
    }

    /// `qact::dot_i16` of four weight rows with one 16-bit activation row.
    pub(crate) fn dot_i16_rows(self, it: Int8Type, w: [&[u8]; 4], x: Q16Row<'_>) -> [f32; 4] {
        #[cfg(target_arch = "x86_64")]
        if self.level.includes_avx2() {
            // SAFETY: every x86 level includes AVX2, FMA and F16C, detected
            // when the kernel was made.
            return unsafe { simd::avx2_i8::dot_i16_rows(it, w, x) };
        }
        w.map(|w| qact::dot_i16(it, w, x))
    }

    /// [`QuantKernel::dot_i16_rows`] of four weight rows with each of the
    /// activation rows `xs` (at most four), into `out[t]`: with AVX-512
    /// VNNI and Q8_0 weights each weight block is prepared once for all of
    /// them (bit-identical results).
    pub(crate) fn dot_i16_tile(
        self,
        it: Int8Type,
        w: [&[u8]; 4],
        xs: &[Q16Row<'_>],
        out: &mut [[f32; 4]],
    ) {
        #[cfg(target_arch = "x86_64")]
        if matches!(self.level, SimdLevel::Avx512 | SimdLevel::Amx) && it == Int8Type::Q8_0 {
            // SAFETY: the integer paths' AVX-512 level includes AVX2, FMA,
            // F16C, AVX-512F/VL/BW and VNNI (struct invariant).
            unsafe { simd::vnni_i8::dot_i16_tile_q8_0(w, xs, out) };
            return;
        }
        for (o, &x) in out.iter_mut().zip(xs) {
            *o = self.dot_i16_rows(it, w, x);
        }
    }

    /// Whether linear layers repack their Q4_0, Q4_1 and Q8_0 weights at
    /// load (see `packed` and `packed_q8`): on the 16-bit path with AVX2,
    /// whose packed kernels beat the row-by-row integer dot products.
    pub fn repacks_weights(self) -> bool {
        self.path.is_16_bit() && self.level.includes_avx2()
    }

    /// The eight outputs of each of one or two consecutive row groups
    /// (`groups`) of packed format `F` for each of one to four activation
    /// rows (the float layout: up to `HALF_TILE_TOKENS`), at
    /// `out[g · xs.len() + t]` for group `g` and row `t`. With AVX-512 VNNI
    /// two groups share 512-bit vectors, and the AVX2 float kernel takes
    /// both groups in one pass (`PackedFormat::avx2_pair`, also at the
    /// AVX-VNNI level, whose integer kernels take one group at a time);
    /// every SIMD level gives the AVX2 bits. A span of more groups (the
    /// AMX level's calls, and one row's at the AVX2 level) goes through
    /// the tiles or the format's row run (`PackedFormat::avx2_row_run`),
    /// else pair by pair. With `reads` at [`WeightReads::FromMemory`] the
    /// SIMD kernels prefetch the weights ahead into L2 as they go; the
    /// bits are the same either way.
    pub(crate) fn packed_dot<F: PackedFormat>(
        self,
        groups: &[u8],
        xs: &[F::Input<'_>],
        out: &mut [[f32; packed::GROUP_ROWS]],
        reads: WeightReads,
    ) {
        let group_bytes = xs.first().map_or(0, |x| F::blocks(x) * F::BLOCK_BYTES);
        #[cfg(target_arch = "x86_64")]
        if let ([x], SimdLevel::Avx2) = (xs, self.level) {
            // SAFETY: AVX2, FMA and F16C were detected when the kernel was
            // made.
            if unsafe { F::avx2_row_run(groups, *x, out, reads) } {
                return;
            }
        }
        #[cfg(target_arch = "x86_64")]
        if group_bytes > 0 && groups.len() > 2 * group_bytes {
            // A span of groups at once (`packed::group_outputs_by_spans`:
            // the AMX level's calls, and one row's at the AVX2 level for a
            // format without a row run): its pairs on tiles configured
            // once where the AMX level has them, else pair by pair, and a
            // last odd group alone.
            let paired = groups.len() / (2 * group_bytes) * 2;
            let (pairs, last) = groups.split_at(paired * group_bytes);
            let (pairs_out, last_out) = out.split_at_mut(paired * xs.len());
            // SAFETY: the AMX level is the AVX-512 level's features (AVX2,
            // FMA, F16C, AVX-512F/VL/BW and VNNI) with AMX tiles this
            // process may use (struct invariant).
            let tiled = self.level == SimdLevel::Amx
                && F::AMX
                && unsafe { F::amx_pairs(pairs, group_bytes, xs, pairs_out) };
            if !tiled {
                let each = pairs.chunks_exact(2 * group_bytes);
                for (pair, out) in each.zip(pairs_out.chunks_exact_mut(2 * xs.len())) {
                    self.packed_dot::<F>(pair, xs, out, reads);
                }
            }
            if !last.is_empty() {
                self.packed_dot::<F>(last, xs, last_out, reads);
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some((a, b)) = packed::as_pair(groups, group_bytes) {
            match self.level {
                SimdLevel::Amx => {
                    // SAFETY: as above.
                    if F::AMX && unsafe { F::amx_pairs(groups, group_bytes, xs, out) } {
                        return;
                    }
                    // SAFETY: as above.
                    unsafe { packed::vnni_pair_in_chunks::<F>(a, b, xs, out, reads) };
                    return;
                }
                SimdLevel::Avx512 => {
                    // SAFETY: the integer paths' AVX-512 level includes
                    // AVX2, FMA, F16C, AVX-512F/VL/BW and VNNI (struct
                    // invariant).
                    unsafe { F::vnni_pair(a, b, xs, out, reads) };
                    return;
                }
                SimdLevel::AvxVnni => {
                    // SAFETY: AVX2, FMA, F16C and AVX-VNNI were detected
                    // when the kernel was made.
                    unsafe { F::avx_vnni_pair(a, b, xs, out, reads) };
                    return;
                }
                SimdLevel::Avx2 => {
                    // SAFETY: AVX2, FMA and F16C were detected when the
                    // kernel was made.
                    unsafe { F::avx2_pair(a, b, xs, out, reads) };
                    return;
                }
                SimdLevel::Scalar | SimdLevel::Neon => {}
            }
        }
        packed::each_group(groups, group_bytes, xs.len(), out, |group, out| {
            let tiles = xs.chunks(F::GROUP_TILE_TOKENS);
            let tiles = tiles.zip(out.chunks_mut(F::GROUP_TILE_TOKENS));
            for (pass, (xs, out)) in tiles.enumerate() {
                self.packed_one_group_dot::<F>(group, xs, out, reads.of_pass(pass))
            }
        });
    }

    /// [`QuantKernel::packed_dot`] of one group.
    fn packed_one_group_dot<F: PackedFormat>(
        self,
        group: &[u8],
        xs: &[F::Input<'_>],
        out: &mut [[f32; packed::GROUP_ROWS]],
        // Only x86-64 has kernels that prefetch.
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] reads: WeightReads,
    ) {
        #[cfg(target_arch = "x86_64")]
        match self.level {
            SimdLevel::Avx512 | SimdLevel::Amx => {
                // SAFETY: the integer paths' AVX-512 level (and the AMX
                // level) includes AVX2, FMA, F16C, AVX-512F/VL/BW and VNNI
                // (struct invariant).
                unsafe { F::vnni(group, xs, out, reads) };
                return;
            }
            SimdLevel::AvxVnni => {
                // SAFETY: AVX2, FMA, F16C and AVX-VNNI were detected when
                // the kernel was made.
                unsafe { F::avx_vnni(group, xs, out, reads) };
                return;
            }
            SimdLevel::Avx2 => {
                // SAFETY: AVX2, FMA and F16C were detected when the kernel
                // was made.
                unsafe { F::avx2(group, xs, out, reads) };
                return;
            }
            SimdLevel::Scalar | SimdLevel::Neon => {}
        }
        F::portable(group, xs, out);
    }

    /// Quantizes an activation row (its length a multiple of 32) to 16 bits,
    /// one scale per block, bit-exactly as `Q16Act::quantize`.
    pub(crate) fn quantize_act16<const SHIFT: u32>(self, x: &[f32]) -> Q16Act<SHIFT> {
        let mut a = Q16Act::zeros(x.len());
        let (hi, lo, scales) = a.parts_mut();
        self.quantize_act16_into::<SHIFT>(x, hi, lo, scales, qact::BLOCK);
        a
    }

    /// [`QuantKernel::quantize_act16`] into the parts of a `Q16Act` sized
    /// for `x`, one scale per `per_scale` values (see
    /// `qact::quantize_q16_into`).
    pub(crate) fn quantize_act16_into<const SHIFT: u32>(
        self,
        x: &[f32],
        hi: &mut [i8],
        lo: &mut [i8],
        scales: BlockScales<'_>,
        per_scale: usize,
    ) {
        #[cfg(target_arch = "x86_64")]
        if matches!(self.level, SimdLevel::Avx512 | SimdLevel::Amx)
            && self.path != QuantPath::F32Activations
        {
            // SAFETY: both levels of the integer paths include AVX-512F and
            // AVX-512BW, detected when the kernel was made.
            unsafe { simd::avx512_i8::quantize_row_q16::<SHIFT>(x, hi, lo, scales, per_scale) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.level.includes_avx2() {
            // SAFETY: every x86 level includes AVX2 and FMA, detected when
            // the kernel was made.
            unsafe { simd::avx2_i8::quantize_row_q16::<SHIFT>(x, hi, lo, scales, per_scale) };
            return;
        }
        qact::quantize_q16_into::<SHIFT>(x, hi, lo, scales, per_scale);
    }

    /// Quantizes an activation row (its length a multiple of 32) to 8 bits,
    /// bit-exactly as `Q8Act::quantize`.
    pub(crate) fn quantize_act(self, x: &[f32]) -> Q8Act {
        #[cfg(target_arch = "x86_64")]
        if self.level.includes_avx2() {
            let mut a = Q8Act::zeros(x.len());
            let (q, d, s) = a.parts_mut();
            // SAFETY: every x86 level includes AVX2 and FMA, detected when
            // the kernel was made.
            unsafe { simd::avx2_i8::quantize_row(x, q, d, s) };
            return a;
        }
        Q8Act::quantize(x)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cpu::kernels::qact::{BYTE, NARROW, WIDE};
    use crate::cpu::kernels::test_util::Rng;

    /// `n` blocks of `qt` with random bytes and small finite f16 scales of
    /// both signs (every other bit pattern is a valid block).
    pub(crate) fn random_blocks(rng: &mut Rng, qt: QuantType, n: usize) -> Vec<u8> {
        let offsets: &[usize] = match qt {
            QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q5_0 => &[0],
            QuantType::IQ4NL | QuantType::IQ4XS => &[0],
            QuantType::Q2K => &[80, 82],
            QuantType::Q3K => &[108],
            QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K | QuantType::Q5K => &[0, 2],
            QuantType::Q6K => &[208],
        };
        let mut out: Vec<u8> = (0..n * qt.block_bytes())
            .map(|_| rng.next_u64() as u8)
            .collect();
        for b in out.chunks_exact_mut(qt.block_bytes()) {
            for &o in offsets {
                let d = half::f16::from_f32(rng.uniform() * 0.1);
                b[o..o + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
        out
    }

    /// The kernels at `level` for `path`, or `None` (with a note) when this
    /// CPU lacks the level or the level has no kernels for `path` (AVX-VNNI
    /// has none for f32 activations).
    pub(crate) fn kernel_or_skip(path: QuantPath, level: SimdLevel) -> Option<QuantKernel> {
        let k = QuantKernel::with_level(path, level);
        if k.is_none() {
            eprintln!("skipping {level:?} for {path:?}: not available on this CPU for this path");
        }
        k
    }

    /// SIMD levels (not scalar) for `path` that this CPU runs.
    fn simd_kernels(path: QuantPath) -> Vec<QuantKernel> {
        [
            SimdLevel::Avx2,
            SimdLevel::AvxVnni,
            SimdLevel::Avx512,
            SimdLevel::Neon,
        ]
        .into_iter()
        .filter_map(|l| kernel_or_skip(path, l))
        .collect()
    }

    const SCALAR: QuantKernel = QuantKernel {
        path: QuantPath::F32Activations,
        level: SimdLevel::Scalar,
    };

    #[test]
    fn levels_are_checked() {
        for path in [QuantPath::F32Activations, QuantPath::Int8Activations] {
            let k = QuantKernel::new(path);
            assert_eq!(k.path(), path);
            assert!(k.level().is_available(path));
            for level in SimdLevel::FASTEST_FIRST {
                let k = QuantKernel::with_level(path, level);
                assert_eq!(k.is_some(), level.is_available(path));
            }
            assert!(QuantKernel::with_level(path, SimdLevel::Scalar).is_some());
        }
        assert_eq!(QuantPath::default(), QuantPath::F32Activations);
    }

    /// A cap picks the fastest available level at or after it, never one
    /// before it; without a cap the kernel is `new`'s.
    #[test]
    fn capped_levels_stay_at_or_below_the_cap() {
        for path in [QuantPath::F32Activations, QuantPath::Int16Activations] {
            let order = SimdLevel::FASTEST_FIRST;
            for (i, max) in order.into_iter().enumerate() {
                for (j, level) in order.into_iter().enumerate() {
                    assert_eq!(level.at_most(max), j >= i, "{level} at most {max}");
                }
                let k = QuantKernel::capped(path, max);
                let want = order[i..].iter().find(|l| l.is_available(path));
                assert_eq!(Some(&k.level()), want, "{path:?} capped at {max}");
                assert_eq!(k.path(), path);
            }
            assert_eq!(QuantKernel::capped(path, order[0]), QuantKernel::new(path));
            assert_eq!(
                QuantKernel::capped(path, SimdLevel::Scalar).level(),
                SimdLevel::Scalar
            );
        }
    }

    /// AVX-VNNI is a level of the integer paths only: the f32 path capped
    /// there runs AVX2, and the integer paths take it exactly when the CPU
    /// has it and not AVX-512 VNNI.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx_vnni_is_an_integer_level() {
        let f32_path = QuantPath::F32Activations;
        assert!(!SimdLevel::AvxVnni.is_available(f32_path));
        assert_eq!(
            QuantKernel::capped(f32_path, SimdLevel::AvxVnni),
            QuantKernel::capped(f32_path, SimdLevel::Avx2)
        );
        for path in [QuantPath::Int16Activations, QuantPath::Int8Packed] {
            let want = if SimdLevel::Amx.is_available(path) {
                SimdLevel::Amx
            } else if SimdLevel::Avx512.is_available(path) {
                SimdLevel::Avx512
            } else if SimdLevel::AvxVnni.is_available(path) {
                SimdLevel::AvxVnni
            } else {
                QuantKernel::capped(path, SimdLevel::Avx2).level()
            };
            assert_eq!(QuantKernel::new(path).level(), want, "{path:?}");
            assert_eq!(
                SimdLevel::AvxVnni.is_available(path),
                SimdLevel::Avx2.is_available(path) && is_x86_feature_detected!("avxvnni"),
                "{path:?}"
            );
        }
    }

    /// The AMX level belongs to the integer paths only (the f32 path capped
    /// there runs AVX-512), and the integer paths take it exactly when the
    /// CPU has AVX-512 VNNI and tiles this process may use.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn amx_is_an_integer_level() {
        let f32_path = QuantPath::F32Activations;
        assert!(!SimdLevel::Amx.is_available(f32_path));
        assert_eq!(
            QuantKernel::capped(f32_path, SimdLevel::Amx),
            QuantKernel::capped(f32_path, SimdLevel::Avx512)
        );
        for path in [QuantPath::Int16Activations, QuantPath::Int8Packed] {
            assert_eq!(
                SimdLevel::Amx.is_available(path),
                SimdLevel::Avx512.is_available(path) && simd::amx::tiles_available(),
                "{path:?}"
            );
        }
    }

    #[test]
    fn levels_parse_by_name() {
        for level in SimdLevel::FASTEST_FIRST {
            assert_eq!(level.name().parse::<SimdLevel>(), Ok(level));
            assert_eq!(
                level.to_string().to_uppercase().parse::<SimdLevel>(),
                Ok(level)
            );
        }
        assert_eq!(
            "sse4".parse::<SimdLevel>(),
            Err(
                "unknown SIMD level 'sse4': expected one of amx, avx512, avxvnni, avx2, neon, scalar"
                    .into()
            )
        );
    }

    /// SIMD dequantization is bit-exact with the scalar reference.
    #[test]
    fn simd_dequantize_is_exact() {
        let mut rng = Rng::new(21);
        for k in simd_kernels(QuantPath::F32Activations) {
            for qt in QuantType::ALL {
                for n in [1, 2, 3, 5] {
                    let w = random_blocks(&mut rng, qt, n);
                    let mut want = vec![0.0f32; n * qt.block_len()];
                    let mut got = vec![f32::NAN; want.len()];
                    qt.dequantize_blocks(&w, &mut want);
                    k.dequantize_row(qt, &w, &mut got);
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(g.to_bits(), w.to_bits(), "{k:?} {qt} value {i}");
                    }
                }
            }
        }
    }

    /// `Σ |w_i x_i|` over the dequantized weights, the scale of rounding
    /// differences between dot-product variants.
    fn magnitude(qt: QuantType, w: &[u8], x: &[f32]) -> f64 {
        let mut wf = vec![0.0f32; x.len()];
        qt.dequantize_blocks(w, &mut wf);
        wf.iter()
            .zip(x)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum()
    }

    /// SIMD tile products agree with the scalar one: `|simd − scalar| ≤
    /// 1e-5 · Σ|x_i w_i|`, for row counts that leave remainders in the
    /// 3 × 4 register blocking and column counts past one column chunk.
    #[test]
    fn simd_gemm_tile_matches_scalar() {
        let mut rng = Rng::new(23);
        for k in simd_kernels(QuantPath::F32Activations) {
            for &(nr, no, kk) in &[
                (1, 1, 32),
                (3, 7, 64),
                (7, 9, 288),
                (2, 4, 544),
                (5, 13, 96),
            ] {
                let xb = rng.vec(nr * kk, 1.0);
                let wb = rng.vec(no * kk, 1.0);
                let mut want = vec![0.0; nr * no];
                let mut got = vec![f32::NAN; nr * no];
                SCALAR.gemm_tile(&xb, nr, kk, &wb, no, &mut want);
                k.gemm_tile(&xb, nr, kk, &wb, no, &mut got);
                for o in 0..no {
                    for t in 0..nr {
                        let (xr, wr) = (&xb[t * kk..][..kk], &wb[o * kk..][..kk]);
                        let mag: f64 = xr.iter().zip(wr).map(|(&a, &b)| (a * b).abs() as f64).sum();
                        let (g, w) = (got[o * nr + t], want[o * nr + t]);
                        assert!(
                            ((g - w) as f64).abs() <= 1e-5 * mag,
                            "{k:?} nr={nr} no={no} k={kk} ({o},{t}): {g} vs {w}"
                        );
                    }
                }
            }
        }
    }

    /// SIMD activation quantization is bit-exact with the scalar one,
    /// including values exactly halfway between two steps and zero blocks.
    #[test]
    fn simd_quantize_act_is_exact() {
        let mut rng = Rng::new(25);
        for k in simd_kernels(QuantPath::Int8Activations) {
            let mut x = rng.vec(32 * 9, 3.0);
            x[32..64].fill(0.0);
            // Block 2: amax 127, so the values are their own quanta; k + 0.5
            // are ties.
            for (j, v) in x[64..96].iter_mut().enumerate() {
                *v = j as f32 - 15.5;
            }
            x[64] = 127.0;
            let want = Q8Act::quantize(&x);
            let got = k.quantize_act(&x);
            let (w, g) = (want.row(), got.row());
            assert_eq!(w.q, g.q, "{k:?}");
            assert_eq!(w.d, g.d, "{k:?}");
            assert_eq!(w.s, g.s, "{k:?}");
        }
    }

    /// Asserts that each of the four-row results `got` equals `want` of its
    /// weight row within `1e-5 · Σ|w_i x_i|` (f32 accumulation order).
    fn assert_rows_close(
        qt: QuantType,
        ws: &[Vec<u8>],
        xf: &[f32],
        got: [f32; 4],
        want: impl Fn(&[u8]) -> f32,
        what: &str,
    ) {
        for (r, (w, got)) in ws.iter().zip(got).enumerate() {
            let want = want(w);
            let tol = 1e-5 * magnitude(qt, w, xf);
            assert!(
                ((got - want) as f64).abs() <= tol,
                "{what} row {r}: {got} vs {want}"
            );
        }
    }

    /// The four-row integer dots equal four single-row dots at the same
    /// level within f32 accumulation order: `|a − b| ≤ 1e-5 · Σ|w_i x_i|`,
    /// and the scalar four-row dot equals the scalar dot exactly.
    #[test]
    fn int8_dot_rows_matches_single_rows() {
        let mut rng = Rng::new(26);
        let mut kernels = simd_kernels(QuantPath::Int8Activations);
        kernels
            .push(QuantKernel::with_level(QuantPath::Int8Activations, SimdLevel::Scalar).unwrap());
        for k in kernels {
            for qt in [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1] {
                let it = Int8Type::from_quant(qt).unwrap();
                for n in [1, 2, 5, 18] {
                    let ws: Vec<Vec<u8>> = (0..4).map(|_| random_blocks(&mut rng, qt, n)).collect();
                    let xq = Q8Act::quantize(&rng.vec(n * 32, 1.0));
                    let x = xq.row();
                    let xf: Vec<f32> = (0..n * 32).map(|i| x.q[i] as f32 * x.d[i / 32]).collect();
                    let got = k.dot_i8_rows(it, std::array::from_fn(|r| &ws[r][..]), x);
                    let what = format!("{k:?} {qt} n={n}");
                    assert_rows_close(qt, &ws, &xf, got, |w| qact::dot_i8(it, w, x), &what);
                }
            }
        }
    }

    /// Every SIMD quantizer gives the scalar one's planes, scales and sums
    /// bit for bit, for each plane split and one scale per block or per
    /// K-quant super-block, on rows with zero blocks, blocks of one
    /// value, values at rounding ties and magnitudes from 1e-30 to 1e30.
    #[test]
    fn simd_quantizers_equal_scalar_bit_for_bit() {
        fn check<const SHIFT: u32>(k: QuantKernel, x: &[f32], per_scale: usize) {
            let want = Q16Act::<SHIFT>::quantize_per(x, per_scale);
            let mut got = Q16Act::<SHIFT>::zeros(x.len());
            let (hi, lo, scales) = got.parts_mut();
            k.quantize_act16_into::<SHIFT>(x, hi, lo, scales, per_scale);
            let (w, g) = (want.row(), got.row());
            assert_eq!(
                (w.hi, w.lo, w.d, w.s, w.sums),
                (g.hi, g.lo, g.d, g.s, g.sums),
                "{k:?} SHIFT={SHIFT} len {} per {per_scale}",
                x.len()
            );
        }
        let mut rng = Rng::new(41);
        for k in simd_kernels(QuantPath::Int16Activations) {
            for blocks in [1, 8, 9, 48, 50] {
                let mut x = rng.vec(32 * blocks, 3.0);
                if blocks > 1 {
                    x[32..64].fill(0.0);
                    x[32 + 5] = -2.5;
                }
                for (i, v) in x.iter_mut().enumerate().skip(64) {
                    match i % 7 {
                        0 => *v *= 1e-30,
                        1 => *v *= 1e30,
                        2 => *v = (i % 5) as f32 - 2.0 + 0.5,
                        _ => {}
                    }
                }
                let supers = blocks % 8 == 0;
                for per_scale in [qact::BLOCK, qact::SUPER_BLOCK] {
                    if per_scale == qact::SUPER_BLOCK && !supers {
                        continue;
                    }
                    check::<NARROW>(k, &x, per_scale);
                    check::<WIDE>(k, &x, per_scale);
                    check::<BYTE>(k, &x, per_scale);
                }
            }
        }
    }

    /// The 16-bit activation path: the four-row SIMD dots agree with the
    /// scalar `dot_i16` within f32 accumulation order (`1e-5 · Σ|w_i x_i|`;
    /// the quantizer: `simd_quantizers_equal_scalar_bit_for_bit`).
    #[test]
    fn simd_int16_path_matches_scalar() {
        let mut rng = Rng::new(27);
        for k in simd_kernels(QuantPath::Int16Activations) {
            for qt in [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1] {
                let it = Int8Type::from_quant(qt).unwrap();
                for n in [1, 2, 5, 18] {
                    let ws: Vec<Vec<u8>> = (0..4).map(|_| random_blocks(&mut rng, qt, n)).collect();
                    let xa = Q16Act::<NARROW>::quantize(&rng.vec(n * 32, 1.0));
                    let x = xa.row();
                    let xf: Vec<f32> = (0..n * 32)
                        .map(|i| x.value(i) as f32 * x.d[i / 32])
                        .collect();
                    let got = k.dot_i16_rows(it, std::array::from_fn(|r| &ws[r][..]), x);
                    let what = format!("{k:?} {qt} n={n}");
                    assert_rows_close(qt, &ws, &xf, got, |w| qact::dot_i16(it, w, x), &what);
                }
            }
        }
    }

    /// SIMD integer dots agree with the scalar one. The block sums are
    /// exact integers in every variant; only the f32 accumulation order
    /// differs: `|simd − scalar| ≤ 1e-5 · Σ|w_i x_i|`. Odd block counts
    /// exercise the VNNI kernel's single-block tail.
    #[test]
    fn simd_int8_dot_matches_scalar() {
        let mut rng = Rng::new(24);
        for k in simd_kernels(QuantPath::Int8Activations) {
            for qt in [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1] {
                let it = Int8Type::from_quant(qt).unwrap();
                for n in [1, 2, 3, 5, 8] {
                    let w = random_blocks(&mut rng, qt, n);
                    let xq = Q8Act::quantize(&rng.vec(n * 32, 1.0));
                    let x = xq.row();
                    let xf: Vec<f32> = (0..n * 32).map(|i| x.q[i] as f32 * x.d[i / 32]).collect();
                    let want = qact::dot_i8(it, &w, x);
                    let got = k.dot_i8(it, &w, x);
                    let tol = 1e-5 * magnitude(qt, &w, &xf);
                    assert!(
                        ((got - want) as f64).abs() <= tol,
                        "{k:?} {qt} n={n}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// The AVX-512 VNNI Q8_0 tile gives each activation row exactly what
    /// the AVX2 four-row dot product gives it alone.
    #[test]
    fn vnni_q8_0_tile_equals_avx2_rows() {
        let (Some(vnni), Some(avx2)) = (
            kernel_or_skip(QuantPath::Int16Activations, SimdLevel::Avx512),
            kernel_or_skip(QuantPath::Int16Activations, SimdLevel::Avx2),
        ) else {
            return;
        };
        let mut rng = Rng::new(71);
        let nb = 18;
        let w: Vec<Vec<u8>> = (0..4)
            .map(|_| random_blocks(&mut rng, QuantType::Q8_0, nb))
            .collect();
        let ws = [&w[0][..], &w[1][..], &w[2][..], &w[3][..]];
        let acts: Vec<Q16Act> = (0..4)
            .map(|_| Q16Act::<NARROW>::quantize(&rng.vec(nb * 32, 2.0)))
            .collect();
        let xs: Vec<Q16Row<'_>> = acts.iter().map(|a| a.row()).collect();
        for t in 1..=4 {
            let mut out = vec![[f32::NAN; 4]; t];
            vnni.dot_i16_tile(Int8Type::Q8_0, ws, &xs[..t], &mut out);
            for (k, got) in out.iter().enumerate() {
                assert_eq!(
                    *got,
                    avx2.dot_i16_rows(Int8Type::Q8_0, ws, xs[k]),
                    "{t} rows"
                );
            }
        }
    }
}
