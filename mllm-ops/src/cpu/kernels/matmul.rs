//! Linear layer (`x · Wᵀ + b`) with f32, f16 or bf16 weights, plus the `dot`
//! and `axpy` building blocks shared by other kernels.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;
use rayon::ThreadPool;

use super::qkernel::{QuantKernel, QuantPath, SimdLevel};
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::simd;
use super::PAR_THRESHOLD;

/// Number of f32 lanes the micro-kernels accumulate per independent chain:
/// one AVX register where AVX is enabled at compile time, otherwise one
/// 128-bit SSE/NEON register.
const LANES: usize = if cfg!(target_feature = "avx") { 8 } else { 4 };

/// Width of the accumulator array in [`dot`] (four independent chains).
const DOT_WIDTH: usize = 4 * LANES;

/// Token rows handled per row block in [`linear`] (bounds the transposed
/// scratch buffer and lets long prefills be split across threads).
const ROW_BLOCK: usize = 64;

/// Columns (input features) processed per pass over a block, so that the
/// activation panel (`ROW_BLOCK × K_CHUNK`) and weight panel stay in cache.
const K_CHUNK: usize = 256;

/// Target number of weights per output-feature block (so that tasks are not
/// too small when `in_f` is small).
const W_BLOCK_FLOATS: usize = 32 * 1024;

/// Largest output-feature block (bounds the converted weight panel to
/// `MAX_OUT_BLOCK × K_CHUNK` f32, 64 KiB).
const MAX_OUT_BLOCK: usize = 64;

/// A weight element type that linear layers and embeddings can read.
pub trait WeightElem: Copy + Send + Sync + 'static {
    /// Converts one element to f32.
    fn to_f32(self) -> f32;

    /// Converts `src` into `dst`; both must have the same length.
    fn convert_slice(src: &[Self], dst: &mut [f32]);

    /// Returns `src` itself when the element type already is f32 (so no
    /// conversion copy is needed), otherwise `None`.
    fn as_f32_slice(src: &[Self]) -> Option<&[f32]> {
        let _ = src;
        None
    }

    /// The raw bits of `src` and their format when the element type is a
    /// 16-bit float (which the SIMD micro-kernels convert in registers),
    /// otherwise `None`.
    fn as_half_bits(src: &[Self]) -> Option<(HalfBits, &[u16])> {
        let _ = src;
        None
    }
}

impl WeightElem for f32 {
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline]
    fn convert_slice(src: &[Self], dst: &mut [f32]) {
        debug_assert_eq!(src.len(), dst.len());
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s;
        }
    }

    #[inline]
    fn as_f32_slice(src: &[Self]) -> Option<&[f32]> {
        Some(src)
    }
}

impl WeightElem for f16 {
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }

    #[inline]
    fn convert_slice(src: &[Self], dst: &mut [f32]) {
        debug_assert_eq!(src.len(), dst.len());
        let n = src.len().min(dst.len());
        // Uses F16C / NEON conversions when the CPU has them.
        src[..n].convert_to_f32_slice(&mut dst[..n]);
    }

    #[inline]
    fn as_half_bits(src: &[Self]) -> Option<(HalfBits, &[u16])> {
        Some((HalfBits::F16, bytemuck::cast_slice(src)))
    }
}

impl WeightElem for bf16 {
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }

    #[inline]
    fn convert_slice(src: &[Self], dst: &mut [f32]) {
        debug_assert_eq!(src.len(), dst.len());
        let bits: &[u16] = bytemuck::cast_slice(src);
        for (d, &b) in dst.iter_mut().zip(bits) {
            *d = f32::from_bits((b as u32) << 16);
        }
    }

    #[inline]
    fn as_half_bits(src: &[Self]) -> Option<(HalfBits, &[u16])> {
        Some((HalfBits::Bf16, bytemuck::cast_slice(src)))
    }
}

/// The 16-bit float formats the SIMD micro-kernels read in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfBits {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

/// Dot product `Σ a[i]·b[i]` of two equally long slices, accumulated in f32
/// with several independent accumulators so that it vectorises.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; DOT_WIDTH];
    let ca = a.chunks_exact(DOT_WIDTH);
    let cb = b.chunks_exact(DOT_WIDTH);
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (xa, xb) in ca.zip(cb) {
        for ((s, &x), &y) in acc.iter_mut().zip(xa).zip(xb) {
            *s += x * y;
        }
    }
    hsum(&acc) + tail
}

/// `y[i] += a * x[i]` for two equally long slices.
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (d, &s) in y.iter_mut().zip(x) {
        *d += a * s;
    }
}

/// Sums an accumulator array pairwise.
#[inline(always)]
fn hsum<const N: usize>(acc: &[f32; N]) -> f32 {
    let mut buf = *acc;
    let mut n = N;
    while n > 1 {
        let half = n / 2;
        for i in 0..half {
            buf[i] += buf[i + half];
        }
        if n % 2 == 1 {
            buf[0] += buf[n - 1];
        }
        n = half;
    }
    if N == 0 {
        0.0
    } else {
        buf[0]
    }
}

/// `acc[l] += a[l] * b[l]` for every lane.
#[inline(always)]
fn fmadd(acc: &mut [f32; LANES], a: &[f32; LANES], b: &[f32; LANES]) {
    for ((s, &x), &y) in acc.iter_mut().zip(a).zip(b) {
        *s += x * y;
    }
}

/// Loads `LANES` consecutive values of `s` starting at `off`.
#[inline(always)]
fn load(s: &[f32], off: usize) -> [f32; LANES] {
    let mut a = [0.0f32; LANES];
    a.copy_from_slice(&s[off..off + LANES]);
    a
}

/// Computes the `R × C` dot products of `R` activation rows with `C` weight
/// rows (all of length `k`), sharing every load across the products.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn micro<const R: usize, const C: usize>(
    xs: [&[f32]; R],
    ws: [&[f32]; C],
    k: usize,
) -> [[f32; C]; R] {
    let xs = xs.map(|s| &s[..k]);
    let ws = ws.map(|s| &s[..k]);
    let mut acc = [[[0.0f32; LANES]; C]; R];
    let full = k / LANES * LANES;
    let mut off = 0;
    while off < full {
        // Load whole lane groups into arrays first: this keeps LLVM from
        // vectorising across iterations (which would need shuffles).
        let xv: [[f32; LANES]; R] = std::array::from_fn(|r| load(xs[r], off));
        let wv: [[f32; LANES]; C] = std::array::from_fn(|c| load(ws[c], off));
        for r in 0..R {
            for c in 0..C {
                fmadd(&mut acc[r][c], &xv[r], &wv[c]);
            }
        }
        off += LANES;
    }
    // Materialise the accumulators as lane vectors before the horizontal
    // sums; otherwise LLVM's SLP vectoriser may group the whole loop by
    // output (C) instead of by lane and fill it with shuffles.
    let acc = std::hint::black_box(acc);
    let mut res = [[0.0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            let mut tail = 0.0f32;
            for i in full..k {
                tail += xs[r][i] * ws[c][i];
            }
            res[r][c] = hsum(&acc[r][c]) + tail;
        }
    }
    res
}

/// The `R × C` dot products of `R` activation rows with `C` weight rows of
/// length `k`, with the fastest micro-kernel `level` has (FMA on 256- or
/// 512-bit vectors, NEON, else the portable [`micro`]). The level is fixed
/// per linear call, so a row's result never depends on the rows beside it.
#[inline(always)]
fn micro_at<const R: usize, const C: usize>(
    level: SimdLevel,
    xs: [&[f32]; R],
    ws: [&[f32]; C],
    k: usize,
) -> [[f32; C]; R] {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` comes from a `QuantKernel`, which holds only
        // levels this CPU has: AVX-512F (with AVX2 and FMA) here.
        SimdLevel::Avx512 | SimdLevel::Amx => unsafe { simd::avx512::micro_any::<R, C>(xs, ws, k) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above: AVX2 and FMA were detected (AVX-VNNI's level
        // has them too).
        SimdLevel::Avx2 | SimdLevel::AvxVnni => unsafe { simd::avx2::micro_any::<R, C>(xs, ws, k) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above: NEON was detected.
        SimdLevel::Neon => unsafe { simd::neon::micro_any::<R, C>(xs, ws, k) },
        _ => micro::<R, C>(xs, ws, k),
    }
}

/// Whether `level` has micro-kernels that read 16-bit float weights
/// directly.
fn reads_half(level: SimdLevel) -> bool {
    level.includes_avx2()
}

/// [`micro_at`] with 16-bit float weight rows (raw bits of `kind`),
/// converted in registers: the same sums, bit for bit, as converting the
/// rows to f32 first (conversion is exact and the lanes and order are the
/// same). Only for levels where [`reads_half`] holds; others convert here.
#[inline(always)]
fn micro_half_at<const R: usize, const C: usize>(
    level: SimdLevel,
    kind: HalfBits,
    xs: [&[f32]; R],
    ws: [&[u16]; C],
    k: usize,
) -> [[f32; C]; R] {
    match (level, kind) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` comes from a `QuantKernel`, which holds only
        // levels this CPU has: AVX-512F (with AVX2, FMA and F16C) here.
        (SimdLevel::Avx512 | SimdLevel::Amx, HalfBits::F16) => unsafe {
            simd::avx512::micro_f16_any::<R, C>(xs, ws, k)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        (SimdLevel::Avx512 | SimdLevel::Amx, HalfBits::Bf16) => unsafe {
            simd::avx512::micro_bf16_any::<R, C>(xs, ws, k)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above: AVX2, FMA and F16C were detected (AVX-VNNI's
        // level has them too).
        (SimdLevel::Avx2 | SimdLevel::AvxVnni, HalfBits::F16) => unsafe {
            simd::avx2::micro_f16_any::<R, C>(xs, ws, k)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above: AVX2 and FMA were detected.
        (SimdLevel::Avx2 | SimdLevel::AvxVnni, HalfBits::Bf16) => unsafe {
            simd::avx2::micro_bf16_any::<R, C>(xs, ws, k)
        },
        _ => {
            let to_f32 = |b: u16| match kind {
                HalfBits::F16 => f16::from_bits(b).to_f32(),
                HalfBits::Bf16 => bf16::from_bits(b).to_f32(),
            };
            let rows: Vec<Vec<f32>> = ws
                .iter()
                .map(|w| w[..k].iter().map(|&b| to_f32(b)).collect())
                .collect();
            micro_at::<R, C>(level, xs, std::array::from_fn(|c| &rows[c][..]), k)
        }
    }
}

/// A `[rows, cols]` panel inside a larger row-major matrix: row `r` is
/// `data[r * stride + off..][..len]`.
#[derive(Clone, Copy)]
struct Panel<'a, T = f32> {
    data: &'a [T],
    stride: usize,
    off: usize,
    len: usize,
}

impl<'a, T> Panel<'a, T> {
    #[inline(always)]
    fn row(&self, r: usize) -> &'a [T] {
        &self.data[r * self.stride + self.off..][..self.len]
    }
}

/// How one linear call multiplies activation rows with weight rows of `T`.
trait RowKernel<T> {
    /// The `R × C` dot products of `xs` with `ws`, all of length `k`.
    fn products<const R: usize, const C: usize>(
        &self,
        xs: [&[f32]; R],
        ws: [&[T]; C],
        k: usize,
    ) -> [[f32; C]; R];
}

/// f32 weight rows, with the micro-kernel of a level ([`micro_at`]).
struct FloatRows(SimdLevel);

impl RowKernel<f32> for FloatRows {
    #[inline(always)]
    fn products<const R: usize, const C: usize>(
        &self,
        xs: [&[f32]; R],
        ws: [&[f32]; C],
        k: usize,
    ) -> [[f32; C]; R] {
        micro_at(self.0, xs, ws, k)
    }
}

/// Raw 16-bit float weight rows of one format, read in place
/// ([`micro_half_at`]).
struct HalfRows(SimdLevel, HalfBits);

impl RowKernel<u16> for HalfRows {
    #[inline(always)]
    fn products<const R: usize, const C: usize>(
        &self,
        xs: [&[f32]; R],
        ws: [&[u16]; C],
        k: usize,
    ) -> [[f32; C]; R] {
        micro_half_at(self.0, self.1, xs, ws, k)
    }
}

/// Accumulates the products of `R` activation rows (from row `t` of `xp`)
/// with all `no` weight rows of `wp` into the transposed block `dst[o][t]`,
/// four weight rows at a time.
#[inline(always)]
fn rows_pass<const R: usize, T>(
    kernel: &impl RowKernel<T>,
    xp: Panel,
    t: usize,
    nr: usize,
    wp: Panel<T>,
    no: usize,
    dst: &mut [f32],
) {
    let k = xp.len;
    let xs: [&[f32]; R] = std::array::from_fn(|r| xp.row(t + r));
    let mut o = 0;
    while o + 4 <= no {
        let ws: [&[T]; 4] = std::array::from_fn(|c| wp.row(o + c));
        for (r, row) in kernel.products::<R, 4>(xs, ws, k).iter().enumerate() {
            for (c, &v) in row.iter().enumerate() {
                dst[(o + c) * nr + t + r] += v;
            }
        }
        o += 4;
    }
    while o < no {
        for (r, row) in kernel
            .products::<R, 1>(xs, [wp.row(o)], k)
            .iter()
            .enumerate()
        {
            dst[o * nr + t + r] += row[0];
        }
        o += 1;
    }
}

/// Accumulates into the transposed block `dst[o][t]` the products of the
/// `nr` activation rows of `xb` with the `no` weight rows of `w` (each `k`
/// long), read in place: four weight rows at a time, each from its start
/// to its end, so that the weights stream through memory in order (one
/// [`K_CHUNK`] of every row in turn made as many streams as rows, which
/// the hardware prefetchers do not follow), prefetched ahead on x86-64.
/// Every product still covers one chunk and adds into `dst` chunk after
/// chunk, so the sums are those of the chunked passes over a converted
/// panel, bit for bit.
fn half_rows_in_place(
    kernel: &HalfRows,
    xb: &[f32],
    nr: usize,
    k: usize,
    w: &[u16],
    no: usize,
    dst: &mut [f32],
) {
    let mut o = 0;
    while o < no {
        let quad = no - o >= 4;
        let mut k0 = 0;
        while k0 < k {
            let kc = K_CHUNK.min(k - k0);
            let x = |t: usize| &xb[t * k + k0..][..kc];
            let row = |c: usize| &w[(o + c) * k + k0..][..kc];
            #[cfg(target_arch = "x86_64")]
            simd::prefetch::side_by_side(
                &w[o * k..][..k],
                if quad { 4 } else { 1 },
                2 * k0,
                2 * kc,
            );
            for t in 0..nr {
                if quad {
                    let sums = kernel.products::<1, 4>([x(t)], std::array::from_fn(row), kc);
                    for (c, &v) in sums[0].iter().enumerate() {
                        dst[(o + c) * nr + t] += v;
                    }
                } else {
                    dst[o * nr + t] += kernel.products::<1, 1>([x(t)], [row(0)], kc)[0][0];
                }
            }
            k0 += kc;
        }
        o += if quad { 4 } else { 1 };
    }
}

/// Computes `dst[o][t] = Σ_i xb[t][i] · wb[o][i]` for `nr` rows of length
/// `k` and `no` weight rows (`dst` is `[no, nr]`, i.e. transposed), in
/// chunks of `K_CHUNK` columns so that the working set stays in cache; each
/// weight chunk is converted (or copied) into `buf` once and reused for all
/// rows, except f32 weights, and f16/bf16 ones where the CPU has kernels
/// for them, with fewer than 4 rows, which are read in place.
#[allow(clippy::too_many_arguments)]
fn block_kernel<W: WeightElem>(
    level: SimdLevel,
    xb: &[f32],
    nr: usize,
    k: usize,
    wb: &[W],
    no: usize,
    dst: &mut [f32],
    buf: &mut Vec<f32>,
) {
    dst.fill(0.0);
    // f32 weights are read in place for few rows; for more rows even they
    // are copied into a contiguous panel, which the micro-kernels stream
    // through faster than strided rows.
    let direct = if nr < 4 { W::as_f32_slice(wb) } else { None };
    // f16 and bf16 weights are read in place for few rows (decode) where
    // the CPU has kernels for them: the bandwidth-bound case, where the
    // conversion copy would cost more than the products.
    let direct_half = if nr < 4 && reads_half(level) {
        W::as_half_bits(wb)
    } else {
        None
    };
    if let Some((kind, data)) = direct_half {
        half_rows_in_place(&HalfRows(level, kind), xb, nr, k, data, no, dst);
        return;
    }
    let mut k0 = 0;
    while k0 < k {
        let kc = K_CHUNK.min(k - k0);
        let xp = Panel {
            data: xb,
            stride: k,
            off: k0,
            len: kc,
        };
        let wp = match direct {
            Some(data) => Panel {
                data,
                stride: k,
                off: k0,
                len: kc,
            },
            None => {
                buf.resize(no * kc, 0.0);
                for (o, d) in buf.chunks_exact_mut(kc).enumerate().take(no) {
                    W::convert_slice(&wb[o * k + k0..][..kc], d);
                }
                Panel {
                    data: &buf[..],
                    stride: kc,
                    off: 0,
                    len: kc,
                }
            }
        };
        let mut t = 0;
        while t + 2 <= nr {
            rows_pass::<2, f32>(&FloatRows(level), xp, t, nr, wp, no, dst);
            t += 2;
        }
        if t < nr {
            rows_pass::<1, f32>(&FloatRows(level), xp, t, nr, wp, no, dst);
        }
        k0 += kc;
    }
}

/// Computes the transposed product `yt[o][t]` for the `nr` rows of `xb` and
/// every output feature, in blocks of `nb` output features.
#[allow(clippy::too_many_arguments)]
fn out_blocks<W: WeightElem>(
    level: SimdLevel,
    xb: &[f32],
    nr: usize,
    in_f: usize,
    w: &[W],
    nb: usize,
    yt: &mut [f32],
    parallel: bool,
) {
    let task = |buf: &mut Vec<f32>, (b, dst): (usize, &mut [f32])| {
        let o0 = b * nb;
        let no = dst.len() / nr;
        let wb = &w[o0 * in_f..(o0 + no) * in_f];
        block_kernel(level, xb, nr, in_f, wb, no, dst, buf);
    };
    if parallel {
        yt.par_chunks_mut(nb * nr)
            .enumerate()
            .for_each_init(Vec::new, task);
    } else {
        let mut buf = Vec::new();
        for item in yt.chunks_mut(nb * nr).enumerate() {
            task(&mut buf, item);
        }
    }
}

/// Writes `y[t][o] = yt[o][t] + bias[o]` for a block of `nr` rows.
fn transpose_bias(yt: &[f32], nr: usize, out_f: usize, bias: Option<&[f32]>, y: &mut [f32]) {
    const TILE: usize = 16;
    for o0 in (0..out_f).step_by(TILE) {
        let o1 = (o0 + TILE).min(out_f);
        for (t, yrow) in y.chunks_exact_mut(out_f).enumerate().take(nr) {
            for o in o0..o1 {
                let b = bias.map_or(0.0, |b| b[o]);
                yrow[o] = yt[o * nr + t] + b;
            }
        }
    }
}

/// Linear layer: `y[t, o] = Σ_i x[t, i] · w[o, i] + bias[o]`.
///
/// * `x` is `[rows, in_f]` row-major f32 activations;
/// * `w` is `[out_f, in_f]` row-major (PyTorch `nn.Linear` layout) with
///   elements f32, f16 or bf16; f16/bf16 weights are converted to f32 in
///   cache-sized panels, once per block of up to 64 rows, and each panel is
///   reused for every row of the block;
/// * `bias`, if given, has `out_f` elements;
/// * `y` is `[rows, out_f]` and is overwritten.
///
/// Accumulates in f32, with the fastest FMA micro-kernel the CPU has (the
/// same one for every row, so rows do not depend on each other). Runs in
/// `pool`, split over blocks of rows and of output features, unless the
/// work (`rows · in_f · out_f`) is tiny.
#[allow(clippy::too_many_arguments)]
pub fn linear<W: WeightElem>(
    x: &[f32],
    rows: usize,
    in_f: usize,
    w: &[W],
    out_f: usize,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
) {
    let kernel = QuantKernel::new(QuantPath::F32Activations);
    linear_at(kernel, x, rows, in_f, w, out_f, bias, y, pool)
}

/// [`linear`] with the FMA micro-kernel of `kernel`'s level (a kernel
/// capped below the CPU's fastest level, see [`QuantKernel::capped`]).
#[allow(clippy::too_many_arguments)]
pub fn linear_at<W: WeightElem>(
    kernel: QuantKernel,
    x: &[f32],
    rows: usize,
    in_f: usize,
    w: &[W],
    out_f: usize,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
) {
    debug_assert_eq!(x.len(), rows * in_f, "x must be [rows, in_f]");
    debug_assert_eq!(w.len(), out_f * in_f, "w must be [out_f, in_f]");
    debug_assert_eq!(y.len(), rows * out_f, "y must be [rows, out_f]");
    if let Some(b) = bias {
        debug_assert_eq!(b.len(), out_f, "bias must have out_f elements");
    }
    if rows == 0 || out_f == 0 {
        return;
    }
    let level = kernel.level();
    let work = rows.saturating_mul(in_f).saturating_mul(out_f);
    let threads = pool.current_num_threads().max(1);
    let parallel = threads > 1 && work >= PAR_THRESHOLD;

    let rb = ROW_BLOCK.min(rows);
    let n_row_blocks = rows.div_ceil(rb);
    // Output-feature block size: about W_BLOCK_FLOATS converted weights, but
    // small enough to give every thread a few tasks; a multiple of 4.
    let mut nb = (W_BLOCK_FLOATS / in_f.max(1)).clamp(4, MAX_OUT_BLOCK);
    if parallel {
        let per_task = (out_f * n_row_blocks) / (4 * threads);
        nb = nb.min(per_task.max(4));
    }
    let nb = nb.div_ceil(4) * 4;

    let row_task = |(rbi, y_chunk): (usize, &mut [f32])| {
        let r0 = rbi * rb;
        let nr = y_chunk.len() / out_f;
        let xb = &x[r0 * in_f..(r0 + nr) * in_f];
        if nr == 1 {
            // The transposed layout of a single row is the row itself.
            out_blocks(level, xb, 1, in_f, w, nb, y_chunk, parallel);
            if let Some(b) = bias {
                for (d, &bv) in y_chunk.iter_mut().zip(b) {
                    *d += bv;
                }
            }
        } else {
            let mut yt = vec![0.0f32; out_f * nr];
            out_blocks(level, xb, nr, in_f, w, nb, &mut yt, parallel);
            transpose_bias(&yt, nr, out_f, bias, y_chunk);
        }
    };
    if parallel {
        pool.install(|| y.par_chunks_mut(rb * out_f).enumerate().for_each(row_task));
    } else {
        y.chunks_mut(rb * out_f).enumerate().for_each(row_task);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::qkernel::tests::kernel_or_skip;
    use crate::cpu::kernels::test_util::{linear_reference, pool1, pool2, Rng};

    /// Tolerance: `|y - ref| <= 1e-5 * (1 + Σ_i |x_i w_i| + |b|)`, for
    /// `linear` and for `linear_at` at every level this CPU runs.
    fn check<W: WeightElem>(
        rng: &mut Rng,
        rows: usize,
        in_f: usize,
        out_f: usize,
        with_bias: bool,
        make: impl Fn(f32) -> W,
        pool: &ThreadPool,
    ) {
        let x = rng.vec(rows * in_f, 1.0);
        let w: Vec<W> = rng.vec(out_f * in_f, 1.0).into_iter().map(make).collect();
        let wf: Vec<f32> = w.iter().map(|&v| v.to_f32()).collect();
        let b = rng.vec(out_f, 1.0);
        let bias = with_bias.then_some(&b[..]);
        let (want, mag) = linear_reference(&x, rows, in_f, &wf, out_f, bias);
        let levels = SimdLevel::FASTEST_FIRST.into_iter();
        let kernels = levels.filter_map(|l| QuantKernel::with_level(QuantPath::F32Activations, l));
        for kernel in std::iter::once(None).chain(kernels.map(Some)) {
            let mut y = vec![f32::NAN; rows * out_f];
            match kernel {
                None => linear(&x, rows, in_f, &w, out_f, bias, &mut y, pool),
                Some(k) => linear_at(k, &x, rows, in_f, &w, out_f, bias, &mut y, pool),
            }
            for i in 0..y.len() {
                let err = (y[i] as f64 - want[i]).abs();
                assert!(
                    err <= 1e-5 * (1.0 + mag[i]),
                    "{kernel:?} rows={rows} in_f={in_f} out_f={out_f} idx={i}: got {} want {}",
                    y[i],
                    want[i]
                );
            }
        }
    }

    #[test]
    fn linear_matches_reference_all_dtypes() {
        let mut rng = Rng::new(1);
        let pools = [pool1(), pool2()];
        for pool in &pools {
            for &rows in &[1, 2, 3, 5, 67] {
                for &in_f in &[1, 7, 33, 100] {
                    for &out_f in &[1, 3, 5, 17, 40] {
                        let bias = (rows + in_f + out_f) % 2 == 0;
                        check(&mut rng, rows, in_f, out_f, bias, |v| v, pool);
                        check(&mut rng, rows, in_f, out_f, !bias, f16::from_f32, pool);
                        check(&mut rng, rows, in_f, out_f, bias, bf16::from_f32, pool);
                    }
                }
            }
        }
    }

    #[test]
    fn linear_large_parallel() {
        let mut rng = Rng::new(2);
        let pool = pool2();
        // Decode-shaped, prefill-shaped (several row blocks) and odd shapes,
        // all above the parallel threshold.
        for &(rows, in_f, out_f) in &[(1, 300, 130), (130, 100, 37), (70, 257, 9), (3, 1000, 61)] {
            check(&mut rng, rows, in_f, out_f, true, |v| v, &pool);
            check(&mut rng, rows, in_f, out_f, false, f16::from_f32, &pool);
            check(&mut rng, rows, in_f, out_f, true, bf16::from_f32, &pool);
        }
    }

    /// `linear` over `rows` rows of `x` into `y` in a pool.
    type RowsFn<'a> = dyn Fn(&[f32], usize, &mut [f32], &ThreadPool) + 'a;

    /// Batch invariance: each row of a multi-row call equals the same row
    /// computed alone, for every weight type, on one or two threads.
    #[test]
    fn every_level_matches_the_portable_micro_kernel() {
        let mut rng = Rng::new(78);
        for k in [0, 5, 64, 300] {
            let x: Vec<Vec<f32>> = (0..2).map(|_| rng.vec(k, 1.0)).collect();
            let w: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(k, 0.5)).collect();
            let xs = [&x[0][..], &x[1][..]];
            let ws = [&w[0][..], &w[1][..], &w[2][..], &w[3][..]];
            let want = micro::<2, 4>(xs, ws, k);
            for level in SimdLevel::FASTEST_FIRST {
                let Some(kernel) = kernel_or_skip(QuantPath::F32Activations, level) else {
                    continue;
                };
                let got = micro_at::<2, 4>(kernel.level(), xs, ws, k);
                let one = micro_at::<1, 1>(kernel.level(), [xs[1]], [ws[2]], k);
                assert_eq!(
                    one[0][0], got[1][2],
                    "{level:?} k {k}: a product depends on R, C"
                );
                for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
                    assert!(
                        (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "{level:?} k {k}: {g} vs {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn half_kernels_equal_the_f32_kernels_on_converted_rows() {
        let mut rng = Rng::new(79);
        for kind in [HalfBits::F16, HalfBits::Bf16] {
            let to_bits = |v: f32| match kind {
                HalfBits::F16 => f16::from_f32(v).to_bits(),
                HalfBits::Bf16 => bf16::from_f32(v).to_bits(),
            };
            let to_f32 = |b: u16| match kind {
                HalfBits::F16 => f16::from_bits(b).to_f32(),
                HalfBits::Bf16 => bf16::from_bits(b).to_f32(),
            };
            for k in [0, 5, 64, 300] {
                let x: Vec<Vec<f32>> = (0..2).map(|_| rng.vec(k, 1.0)).collect();
                let w: Vec<Vec<u16>> = (0..4)
                    .map(|_| rng.vec(k, 0.5).into_iter().map(to_bits).collect())
                    .collect();
                let wf: Vec<Vec<f32>> = w
                    .iter()
                    .map(|r| r.iter().map(|&b| to_f32(b)).collect())
                    .collect();
                let xs = [&x[0][..], &x[1][..]];
                for level in SimdLevel::FASTEST_FIRST {
                    let Some(kernel) = QuantKernel::with_level(QuantPath::F32Activations, level)
                    else {
                        continue;
                    };
                    let l = kernel.level();
                    let ws = std::array::from_fn(|c| &w[c][..]);
                    let direct = micro_half_at::<2, 4>(l, kind, xs, ws, k);
                    let converted = micro_at::<2, 4>(l, xs, std::array::from_fn(|c| &wf[c][..]), k);
                    let bits = |m: [[f32; 4]; 2]| m.map(|r| r.map(f32::to_bits));
                    assert_eq!(bits(direct), bits(converted), "{kind:?} {level:?} k {k}");
                }
            }
        }
    }

    #[test]
    fn each_row_equals_the_row_alone() {
        let mut rng = Rng::new(77);
        let (p1, p2) = (pool1(), pool2());
        // Rows wider than one K_CHUNK (with a part chunk) check that the
        // in-place pass over 16-bit rows adds its chunks in the panel order.
        let shapes = [
            (2, 40, 9),
            (5, 64, 130),
            (70, 96, 300),
            (2, 600, 37),
            (5, 600, 37),
        ];
        for &(rows, in_f, out_f) in &shapes {
            let x = rng.vec(rows * in_f, 1.0);
            let w32 = rng.vec(out_f * in_f, 0.5);
            let w16: Vec<f16> = w32.iter().map(|&v| f16::from_f32(v)).collect();
            let wb: Vec<bf16> = w32.iter().map(|&v| bf16::from_f32(v)).collect();
            let b = rng.vec(out_f, 1.0);
            let check = |run: &RowsFn<'_>| {
                let mut all = vec![f32::NAN; rows * out_f];
                run(&x, rows, &mut all, &p2);
                for (t, want) in all.chunks_exact(out_f).enumerate() {
                    let mut one = vec![f32::NAN; out_f];
                    run(&x[t * in_f..(t + 1) * in_f], 1, &mut one, &p1);
                    assert_eq!(one, want, "row {t} of {rows}");
                }
            };
            check(&|x, r, y, p| linear(x, r, in_f, &w32, out_f, Some(&b), y, p));
            check(&|x, r, y, p| linear(x, r, in_f, &w16, out_f, None, y, p));
            check(&|x, r, y, p| linear(x, r, in_f, &wb, out_f, Some(&b), y, p));
        }
    }

    #[test]
    fn linear_degenerate() {
        let pool = pool2();
        let mut y = vec![f32::NAN; 6];
        linear::<f32>(&[], 2, 0, &[], 3, Some(&[1.0, 2.0, 3.0]), &mut y, &pool);
        assert_eq!(y, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
        linear::<f32>(&[], 0, 4, &[0.0; 8], 2, None, &mut [], &pool);
    }

    #[test]
    fn half_conversions_are_exact() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let h: Vec<f16> = all.iter().map(|&b| f16::from_bits(b)).collect();
        let b: Vec<bf16> = all.iter().map(|&b| bf16::from_bits(b)).collect();
        let mut out = vec![0.0f32; all.len()];
        f16::convert_slice(&h, &mut out);
        for (x, &y) in h.iter().zip(&out) {
            let want = x.to_f32();
            assert!(
                want.to_bits() == y.to_bits() || (want.is_nan() && y.is_nan()),
                "{x:?}"
            );
        }
        bf16::convert_slice(&b, &mut out);
        for (x, &y) in b.iter().zip(&out) {
            let want = x.to_f32();
            assert!(
                want.to_bits() == y.to_bits() || (want.is_nan() && y.is_nan()),
                "{x:?}"
            );
        }
    }

    #[test]
    fn dot_and_axpy() {
        let mut rng = Rng::new(3);
        for n in [0, 1, 7, 15, 16, 33, 100, 1000] {
            let a = rng.vec(n, 1.0);
            let b = rng.vec(n, 1.0);
            let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let mag: f64 = a
                .iter()
                .zip(&b)
                .map(|(&x, &y)| (x as f64 * y as f64).abs())
                .sum();
            assert!((dot(&a, &b) as f64 - want).abs() <= 1e-6 * (1.0 + mag));
            let mut y = b.clone();
            axpy(0.5, &a, &mut y);
            for i in 0..n {
                assert!((y[i] as f64 - (b[i] as f64 + 0.5 * a[i] as f64)).abs() <= 1e-6);
            }
        }
    }
}
