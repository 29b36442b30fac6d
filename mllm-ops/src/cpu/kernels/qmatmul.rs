//! Linear layers with block-quantized weights: `y[t, o] = Σ_i x[t, i] ·
//! W[o, i] + bias[o]` for `W` stored as rows of blocks.
//!
//! * f32 activations (and K-quant weights on every path): tiles of weight
//!   rows are dequantized once into an f32 scratch buffer and multiplied
//!   with a block of activation rows by a register-blocked tile product,
//!   parallel over tiles;
//! * 16-bit activations ([`QuantPath::Int16Activations`], the default of the
//!   linear op) work as the 8-bit ones below, with two byte dot products
//!   per block;
//! * 8-bit activations ([`QuantPath::Int8Activations`], Q8_0/Q4_0/Q4_1
//!   weights): each row is quantized once and each output is an integer
//!   dot product, parallel over output features; with several rows, each
//!   group of four weight rows meets every activation row while in cache.
//!
//! The path depends on the weight type only, never on the number of rows,
//! and every output is computed the same way whatever shares the call: a
//! row's result does not depend on the rest of the batch (the server's
//! outputs do not depend on the load).

use mllm_core::{Error, Result};
use rayon::prelude::*;
use rayon::ThreadPool;

use super::qact::{Int8Type, NARROW};
use super::qkernel::{QuantKernel, QuantPath};
use super::task_queue::for_each_in_runs;
use super::PAR_THRESHOLD;
use crate::quant::QuantType;

/// Dequantized weights per prefill tile (128 KiB of f32).
const TILE_FLOATS: usize = 32 * 1024;

/// Largest number of weight rows per prefill tile.
const MAX_TILE_ROWS: usize = 64;

/// Outputs per block of activation rows (keeps a block's activations and
/// outputs in cache while a task goes through its weights).
const ROW_BLOCK_OUTPUTS: usize = 1 << 20;

/// Activation rows per block: at least this many (so that a weight tile is
/// dequantized at most once per this many rows)…
const MIN_ROW_BLOCK: usize = 64;
/// …and at most this many.
const MAX_ROW_BLOCK: usize = 256;

/// Weights (in values) below which a task is not split further.
const MIN_TASK_WEIGHTS: usize = 16 * 1024;
/// Tasks per thread of a one-row call (decode) of at least
/// [`QUEUED_WORK`]. Such a call streams its weights from memory once, and
/// a thread that has run out of tasks waits for the others' last ones:
/// small tasks keep that wait short (1.1B Q4_K_M decode 1.04x against four
/// per thread). Several rows keep four larger tasks per thread (16 made
/// 512-token prefill 3 % slower).
const DECODE_TASKS_PER_THREAD: usize = 16;
/// Tasks per thread of a shorter one-row call, split by rayon's
/// fork-join: one. Each further task there costs a join and a steal, a
/// good part of a call of a few microseconds (SmolLM2 Q4_1 decode 1.08x,
/// its Q4_K_M 1.09x against 16 per thread); a thread that finds the other
/// late runs both halves itself.
const FORK_JOIN_DECODE_TASKS_PER_THREAD: usize = 1;
/// Work (multiply-adds) from which a one-row call takes its tasks from a
/// `task_queue`, whose caller waits for the last task without sleeping:
/// 1.1B Q4_K_M decode 1.07x. Below it, where the queue's own cost (a
/// spawned job, a lock per task) is not small against the call, rayon's
/// fork-join stays: SmolLM2 decode was 15 % slower with every call queued.
const QUEUED_WORK: usize = 1 << 20;
/// Activation rows per call of an integer-path tile.
const TILE_ROWS: usize = 4;

/// A quantized weight matrix `[rows, cols]` stored as rows of blocks.
#[derive(Clone, Copy, Debug)]
pub struct QuantMatrix<'a> {
    qt: QuantType,
    data: &'a [u8],
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

impl<'a> QuantMatrix<'a> {
    /// Views `data` as `rows` rows of `cols` values of `qt`; fails when
    /// `cols` is not a multiple of the block length or `data` has the wrong
    /// size.
    pub fn new(qt: QuantType, data: &'a [u8], rows: usize, cols: usize) -> Result<Self> {
        if !cols.is_multiple_of(qt.block_len()) {
            return Err(Error::UnsupportedDType(format!(
                "{qt}: rows of {cols} values are not a whole number of {}-value blocks",
                qt.block_len()
            )));
        }
        let row_bytes = cols / qt.block_len() * qt.block_bytes();
        let expected = rows.checked_mul(row_bytes);
        if expected != Some(data.len()) {
            return Err(Error::SizeMismatch {
                name: "quantized matrix".into(),
                shape: vec![rows, cols],
                dtype: qt.to_string(),
                len: data.len() as u64,
                expected: expected.unwrap_or(0) as u64,
            });
        }
        Ok(QuantMatrix {
            qt,
            data,
            rows,
            cols,
            row_bytes,
        })
    }

    /// A view whose parts were already validated by [`QuantMatrix::new`]
    /// (inconsistent parts make row accesses panic, never read out of
    /// bounds).
    pub(crate) fn from_checked(qt: QuantType, data: &'a [u8], rows: usize, cols: usize) -> Self {
        debug_assert!(QuantMatrix::new(qt, data, rows, cols).is_ok());
        QuantMatrix {
            qt,
            data,
            rows,
            cols,
            row_bytes: cols / qt.block_len() * qt.block_bytes(),
        }
    }

    /// The block format.
    pub fn quant_type(&self) -> QuantType {
        self.qt
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The blocks of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Rows `first..first + n` as a matrix of their own, or `None` past
    /// the last row.
    pub(crate) fn rows_range(&self, first: usize, n: usize) -> Option<QuantMatrix<'a>> {
        let end = first.checked_add(n).filter(|&end| end <= self.rows)?;
        Some(QuantMatrix {
            data: &self.data[first * self.row_bytes..end * self.row_bytes],
            rows: n,
            ..*self
        })
    }

    /// The blocks of rows `r0..r0 + n`.
    fn rows_bytes(&self, r0: usize, n: usize) -> &'a [u8] {
        &self.data[r0 * self.row_bytes..(r0 + n) * self.row_bytes]
    }
}

/// How the work of one call is split.
pub(crate) struct Split<'p> {
    pool: &'p ThreadPool,
    threads: usize,
    parallel: bool,
    /// Whether a parallel one-row call takes its tasks from a
    /// `task_queue` instead of rayon's fork-join.
    queued: bool,
}

impl<'p> Split<'p> {
    /// The split of `work` multiply-adds over `pool`: serial when the pool
    /// has one thread or the work is tiny.
    pub(crate) fn new(pool: &'p ThreadPool, work: usize) -> Split<'p> {
        let threads = pool.current_num_threads().max(1);
        Split {
            pool,
            threads,
            parallel: threads > 1 && work >= PAR_THRESHOLD,
            queued: work >= QUEUED_WORK,
        }
    }

    /// The pool, and whether this call runs in it.
    pub(crate) fn pool(&self) -> Option<&'p ThreadPool> {
        self.parallel.then_some(self.pool)
    }

    /// Output features per task for `rows` activation rows: about
    /// [`DECODE_TASKS_PER_THREAD`] tasks per thread for one row of a queued
    /// call, [`FORK_JOIN_DECODE_TASKS_PER_THREAD`] for one row of a shorter
    /// one, four for more rows, none tiny.
    pub(crate) fn outputs_per_task(
        &self,
        out_f: usize,
        weights_per_output: usize,
        rows: usize,
    ) -> usize {
        let per_thread = match (rows, self.queued) {
            (1, true) => DECODE_TASKS_PER_THREAD,
            (1, false) => FORK_JOIN_DECODE_TASKS_PER_THREAD,
            _ => 4,
        };
        let min = MIN_TASK_WEIGHTS.div_ceil(weights_per_output.max(1));
        out_f.div_ceil(per_thread * self.threads).max(min).max(1)
    }

    /// Runs `f(scratch, c, pieces)` over the blocks of `cols` columns of
    /// the row-major matrix `data` (rows of `width` values), in the pool
    /// when the call is parallel: `pieces[t]` is row `t`'s part of block
    /// `c` (columns `c·cols..`), so each task writes its outputs straight
    /// into their rows. `init` makes per-task scratch.
    pub(crate) fn for_column_blocks<S>(
        &self,
        data: &mut [f32],
        width: usize,
        cols: usize,
        init: impl Fn() -> S + Sync + Send,
        f: impl Fn(&mut S, usize, &mut [&mut [f32]]) + Sync + Send,
    ) {
        if width == 0 || cols == 0 {
            return;
        }
        let rows = data.len() / width;
        if rows == 1 {
            // One row (decode): its blocks are plain chunks, no piece lists;
            // a longer call hands them out in runs, one per thread (see
            // `task_queue`).
            let run = |s: &mut S, c: usize, piece: &mut [f32]| f(s, c, &mut [piece]);
            if !self.parallel {
                let mut s = init();
                for (c, piece) in data.chunks_mut(cols).enumerate() {
                    run(&mut s, c, piece);
                }
            } else if self.queued {
                let blocks = data.chunks_mut(cols).collect();
                self.pool.install(|| for_each_in_runs(blocks, &init, run));
            } else {
                self.pool.install(|| {
                    data.par_chunks_mut(cols)
                        .enumerate()
                        .for_each_init(&init, |s, (c, piece)| run(s, c, piece))
                });
            }
            return;
        }
        let mut blocks: Vec<Vec<&mut [f32]>> = (0..width.div_ceil(cols))
            .map(|_| Vec::with_capacity(rows))
            .collect();
        for row in data.chunks_exact_mut(width) {
            for (block, piece) in blocks.iter_mut().zip(row.chunks_mut(cols)) {
                block.push(piece);
            }
        }
        if self.parallel {
            self.pool.install(|| {
                blocks
                    .into_par_iter()
                    .enumerate()
                    .for_each_init(&init, |s, (c, mut pieces)| f(s, c, &mut pieces))
            });
        } else {
            let mut s = init();
            for (c, mut pieces) in blocks.into_iter().enumerate() {
                f(&mut s, c, &mut pieces);
            }
        }
    }
}

/// Linear layer with quantized weights:
/// `y[t, o] = Σ_i x[t, i] · w[o, i] + bias[o]`.
///
/// * `x` is `[rows, w.cols()]` row-major f32 activations;
/// * `w` is `[out_f, in_f]` (PyTorch `nn.Linear` layout) in blocks;
/// * `bias`, if given, has `out_f` elements;
/// * `y` is `[rows, out_f]` and is overwritten.
///
/// `kernel` picks the activation path and instruction set. Runs in `pool`
/// unless the work (`rows · in_f · out_f`) is tiny. Slice lengths are
/// checked with `debug_assert!`.
pub fn quant_linear(
    kernel: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &QuantMatrix<'_>,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
) {
    let (in_f, out_f) = (w.cols(), w.rows());
    debug_assert_eq!(x.len(), rows * in_f, "x must be [rows, in_f]");
    debug_assert_eq!(y.len(), rows * out_f, "y must be [rows, out_f]");
    if let Some(b) = bias {
        debug_assert_eq!(b.len(), out_f, "bias must have out_f elements");
    }
    if rows == 0 || out_f == 0 {
        return;
    }
    if in_f == 0 {
        for row in y.chunks_exact_mut(out_f) {
            add_bias(row, 0, bias, true);
        }
        return;
    }
    let split = Split::new(pool, rows.saturating_mul(in_f).saturating_mul(out_f));
    let qt = w.quant_type();
    let int = match kernel.path() {
        QuantPath::Int8Activations | QuantPath::Int16Activations | QuantPath::Int8Packed => {
            Int8Type::from_quant(qt)
        }
        QuantPath::F32Activations => None,
    };
    // The path depends only on the weight type and the kernel, never on the
    // number of rows, so a row's result is the same whatever shares the call.
    match int {
        Some(it) if kernel.path().is_16_bit() => {
            let acts: Vec<_> = x
                .chunks_exact(in_f)
                .map(|r| kernel.quantize_act16::<NARROW>(r))
                .collect();
            let xs: Vec<_> = acts.iter().map(|a| a.row()).collect();
            matmul_i8(w, rows, bias, y, &split, |ws, t, out| {
                kernel.dot_i16_tile(it, ws, &xs[t..t + out.len()], out)
            });
        }
        Some(it) => {
            let acts: Vec<_> = x
                .chunks_exact(in_f)
                .map(|r| kernel.quantize_act(r))
                .collect();
            matmul_i8(w, rows, bias, y, &split, |ws, t, out| {
                for (o, a) in out.iter_mut().zip(&acts[t..]) {
                    *o = kernel.dot_i8_rows(it, ws, a.row());
                }
            });
        }
        None => tiled(kernel, x, rows, w, bias, y, &split),
    }
}

/// Adds `bias[o0..]` to `ys` (or sets `ys` to it when `overwrite`).
fn add_bias(ys: &mut [f32], o0: usize, bias: Option<&[f32]>, overwrite: bool) {
    match bias {
        Some(b) => {
            for (v, &bv) in ys.iter_mut().zip(&b[o0..]) {
                *v = if overwrite { bv } else { *v + bv };
            }
        }
        None if overwrite => ys.fill(0.0),
        None => {}
    }
}

/// Activation rows on the integer path: for each four weight rows (the last
/// group of a task padded with repeats of its last row), `tile(weights, t,
/// out)` fills `out[k]` with their outputs for activation row `t + k`, for
/// up to [`TILE_ROWS`] rows at a time, while those weights are in cache. Every
/// output is computed the same way whatever the other rows are, so a row's
/// result does not depend on them.
fn matmul_i8(
    w: &QuantMatrix<'_>,
    rows: usize,
    bias: Option<&[f32]>,
    y: &mut [f32],
    split: &Split<'_>,
    tile: impl Fn([&[u8]; 4], usize, &mut [[f32; 4]]) + Sync + Send,
) {
    let out_f = w.rows();
    let chunk = split
        .outputs_per_task(out_f, w.cols(), rows)
        .next_multiple_of(4);
    let rb = row_block(rows, out_f);
    for (b, y_block) in y.chunks_mut(rb * out_f).enumerate() {
        let t0 = b * rb;
        split.for_column_blocks(
            y_block,
            out_f,
            chunk,
            || (),
            |_, c, rows_out| {
                let (o0, no, nr) = (c * chunk, rows_out[0].len(), rows_out.len());
                for g in (0..no).step_by(4) {
                    let first = o0 + g;
                    let n = 4.min(no - g);
                    let ws = std::array::from_fn(|r| w.row(first + r.min(n - 1)));
                    for t in (0..nr).step_by(TILE_ROWS) {
                        let m = TILE_ROWS.min(nr - t);
                        let mut v = [[0.0f32; 4]; TILE_ROWS];
                        tile(ws, t0 + t, &mut v[..m]);
                        for (row_out, vk) in rows_out[t..t + m].iter_mut().zip(&v) {
                            row_out[g..g + n].copy_from_slice(&vk[..n]);
                        }
                    }
                }
            },
        );
    }
    add_bias_rows(y, out_f, bias);
}

/// Activation rows per block for `out_f` outputs.
fn row_block(rows: usize, out_f: usize) -> usize {
    (ROW_BLOCK_OUTPUTS / out_f)
        .clamp(MIN_ROW_BLOCK, MAX_ROW_BLOCK)
        .min(rows)
}

/// Adds `bias` to every row (of `out_f` values) of `y`.
pub(crate) fn add_bias_rows(y: &mut [f32], out_f: usize, bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in y.chunks_exact_mut(out_f) {
            for (v, &bv) in row.iter_mut().zip(b) {
                *v += bv;
            }
        }
    }
}

/// Several activation rows: weight tiles dequantized once per block of
/// activation rows, then multiplied as f32.
fn tiled(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &QuantMatrix<'_>,
    bias: Option<&[f32]>,
    y: &mut [f32],
    split: &Split<'_>,
) {
    let (in_f, out_f) = (w.cols(), w.rows());
    let rb = row_block(rows, out_f);
    let mut nb = (TILE_FLOATS / in_f).clamp(4, MAX_TILE_ROWS);
    if split.parallel {
        nb = nb.min(out_f.div_ceil(4 * split.threads)).max(4);
    }
    let nb = nb / 4 * 4;
    for (rbi, y_block) in y.chunks_mut(rb * out_f).enumerate() {
        let nr = y_block.len() / out_f;
        let xb = &x[rbi * rb * in_f..][..nr * in_f];
        let scratch = || (Vec::new(), Vec::new());
        split.for_column_blocks(y_block, out_f, nb, scratch, |(buf, yt), b, rows_out| {
            let (o0, no) = (b * nb, rows_out[0].len());
            buf.resize(no * in_f, 0.0);
            k.dequantize_row(w.quant_type(), w.rows_bytes(o0, no), buf);
            // `yt[o·nr + t]` = output `o0 + o` of activation row `t`.
            yt.resize(no * nr, 0.0);
            k.gemm_tile(xb, nr, in_f, buf, no, yt);
            for (t, row_out) in rows_out.iter_mut().enumerate() {
                for (o, v) in row_out.iter_mut().enumerate() {
                    *v = yt[o * nr + t];
                }
            }
        });
    }
    add_bias_rows(y, out_f, bias);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::qkernel::tests::{kernel_or_skip, random_blocks};
    use crate::cpu::kernels::qkernel::SimdLevel;
    use crate::cpu::kernels::test_util::{assert_within, linear_reference, pool1, pool2, Rng};

    struct Case {
        qt: QuantType,
        rows: usize,
        blocks: usize,
        out_f: usize,
        bias: bool,
    }

    /// Runs `quant_linear` with `k` and returns (output, dequantized-weight
    /// f64 reference, magnitudes, activations, weights).
    #[allow(clippy::type_complexity)]
    fn run(
        rng: &mut Rng,
        k: QuantKernel,
        c: &Case,
        pool: &ThreadPool,
    ) -> (Vec<f32>, Vec<f64>, Vec<f64>) {
        let in_f = c.blocks * c.qt.block_len();
        let w = random_blocks(rng, c.qt, c.out_f * c.blocks);
        let mut wf = vec![0.0; c.out_f * in_f];
        c.qt.dequantize_blocks(&w, &mut wf);
        let x = rng.vec(c.rows * in_f, 1.0);
        let b = rng.vec(c.out_f, 1.0);
        let bias = c.bias.then_some(&b[..]);
        let m = QuantMatrix::new(c.qt, &w, c.out_f, in_f).unwrap();
        let mut y = vec![f32::NAN; c.rows * c.out_f];
        quant_linear(k, &x, c.rows, &m, bias, &mut y, pool);
        let (want, mag) = linear_reference(&x, c.rows, in_f, &wf, c.out_f, bias);
        (y, want, mag)
    }

    fn cases() -> Vec<Case> {
        let mut v = Vec::new();
        for qt in QuantType::ALL {
            let big = qt.block_len() == 256;
            for &rows in &[1, 3, 7, 70] {
                for &(blocks, out_f) in &[(1, 5), (3, 37), (if big { 2 } else { 9 }, 130)] {
                    let bias = (rows + blocks + out_f) % 2 == 0;
                    v.push(Case {
                        qt,
                        rows,
                        blocks,
                        out_f,
                        bias,
                    });
                }
            }
            // More rows than one row block (`MAX_ROW_BLOCK`) holds.
            v.push(Case {
                qt,
                rows: MAX_ROW_BLOCK + 44,
                blocks: 1,
                out_f: 5,
                bias: true,
            });
        }
        v
    }

    /// Every element of a row-major matrix reaches exactly one task of
    /// `for_column_blocks`, as part of the right row and block (the last
    /// block narrower), serial and parallel, for several rows and for one
    /// (by fork-join and queued).
    #[test]
    fn column_blocks_cover_each_element_once() {
        let (width, cols) = (10, 4);
        let pool = pool2();
        let works = [0, PAR_THRESHOLD, QUEUED_WORK];
        for (rows, work) in [3, 1].into_iter().flat_map(|r| works.map(|w| (r, w))) {
            let split = Split::new(&pool, work);
            let mut m = vec![0.0f32; rows * width];
            split.for_column_blocks(
                &mut m,
                width,
                cols,
                || (),
                |_, c, pieces| {
                    assert_eq!(pieces.len(), rows);
                    for (t, piece) in pieces.iter_mut().enumerate() {
                        assert_eq!(piece.len(), cols.min(width - c * cols));
                        for (i, v) in piece.iter_mut().enumerate() {
                            *v += (100 * t + c * cols + i) as f32;
                        }
                    }
                },
            );
            let want: Vec<f32> = (0..rows * width)
                .map(|e| (100 * (e / width) + e % width) as f32)
                .collect();
            assert_eq!(m, want, "rows {rows}, work {work}");
        }
    }

    /// One activation row of a queued call splits into about
    /// `DECODE_TASKS_PER_THREAD` tasks per thread, of a shorter call into
    /// one per thread, more rows into four; none below `MIN_TASK_WEIGHTS`
    /// weights per task.
    #[test]
    fn decode_splits_finer_than_prefill() {
        let pool = pool2();
        let split = Split::new(&pool, usize::MAX);
        assert_eq!(split.outputs_per_task(8192, 2048, 1), 8192 / 32);
        assert_eq!(split.outputs_per_task(8192, 2048, 4), 8192 / 8);
        assert_eq!(split.outputs_per_task(64, 2048, 1), 8);
        assert_eq!(split.outputs_per_task(64, 2048, 4), 8);
        let short = Split::new(&pool, QUEUED_WORK - 1);
        assert_eq!(short.outputs_per_task(1536, 576, 1), 1536 / 2);
        assert_eq!(short.outputs_per_task(1536, 576, 4), 1536 / 8);
        assert_eq!(short.outputs_per_task(16, 576, 1), 29);
    }

    /// The f32-activation path at every level equals the f64 product of the
    /// dequantized weights within `1e-4 · (Σ|x·w| + |b|)` (measured worst
    /// case about 1e-7), on one and two threads.
    #[test]
    fn f32_path_matches_dequantized_reference() {
        let mut rng = Rng::new(31);
        for level in SimdLevel::FASTEST_FIRST {
            let Some(k) = kernel_or_skip(QuantPath::F32Activations, level) else {
                continue;
            };
            for pool in [pool1(), pool2()] {
                for c in cases() {
                    let (y, want, mag) = run(&mut rng, k, &c, &pool);
                    let what = format!("{level:?} {} rows={} out={}", c.qt, c.rows, c.out_f);
                    assert_within(&y, &want, &mag, 1e-4, &what);
                }
            }
        }
    }

    /// The int8 path at every SIMD level agrees with
    /// the scalar int8 path within `1e-5 · (Σ|x·w| + |b|)` (the integer block
    /// sums are exact, only the f32 accumulation order differs), and with
    /// the f32 reference within the activations' rounding (`2e-2 ·
    /// magnitude`; 8-bit activations have a relative error of about 0.4 %
    /// per value). Two threads, so that tasks split the outputs.
    #[test]
    fn int8_path_matches_scalar_int8() {
        let scalar =
            QuantKernel::with_level(QuantPath::Int8Activations, SimdLevel::Scalar).unwrap();
        let pool = pool2();
        for level in SimdLevel::FASTEST_FIRST {
            let Some(k) = kernel_or_skip(QuantPath::Int8Activations, level) else {
                continue;
            };
            let int_types = cases().into_iter().filter(|c| c.qt.block_len() == 32);
            for c in int_types {
                // The same seed gives both runs the same data.
                let (y, want, mag) = run(&mut Rng::new(32), k, &c, &pool);
                let (ys, _, _) = run(&mut Rng::new(32), scalar, &c, &pool);
                let what = format!("{level:?} {} out={}", c.qt, c.out_f);
                let scalar: Vec<f64> = ys.iter().map(|&v| v as f64).collect();
                assert_within(&y, &scalar, &mag, 1e-5, &what);
                assert_within(&y, &want, &mag, 2e-2, &what);
            }
        }
    }

    /// The 16-bit path at every level equals the f64
    /// product of the dequantized weights with the f32 activations within
    /// `1e-4 · (Σ|x·w| + |b|)` (16-bit activations round to 1/32512 of
    /// each block's largest value), on two threads.
    #[test]
    fn int16_path_matches_dequantized_reference() {
        let pool = pool2();
        for level in SimdLevel::FASTEST_FIRST {
            let Some(k) = kernel_or_skip(QuantPath::Int16Activations, level) else {
                continue;
            };
            let int_types = cases().into_iter().filter(|c| c.qt.block_len() == 32);
            for c in int_types {
                let (y, want, mag) = run(&mut Rng::new(34), k, &c, &pool);
                let what = format!("{level:?} {} out={}", c.qt, c.out_f);
                assert_within(&y, &want, &mag, 1e-4, &what);
            }
        }
    }

    /// K-quant weights take the f32 path on the integer paths too, for any
    /// number of rows: exactly the same result.
    #[test]
    fn integer_paths_use_f32_path_for_k_quants() {
        let pool = pool2();
        for path in [QuantPath::Int8Activations, QuantPath::Int16Activations] {
            let int = QuantKernel::new(path);
            let f32k = QuantKernel::capped(QuantPath::F32Activations, int.level());
            for c in cases().into_iter().filter(|c| c.qt.block_len() == 256) {
                let (a, _, _) = run(&mut Rng::new(33), int, &c, &pool);
                let (b, _, _) = run(&mut Rng::new(33), f32k, &c, &pool);
                assert_eq!(a, b, "{path:?} {} rows={}", c.qt, c.rows);
            }
        }
    }

    /// Batch invariance: every path at every level gives each activation
    /// row exactly the result it gets alone, whatever other rows share the
    /// call and however the work is split over one or two threads.
    #[test]
    fn each_row_equals_the_row_alone() {
        let paths = [
            QuantPath::F32Activations,
            QuantPath::Int8Activations,
            QuantPath::Int16Activations,
        ];
        let (p1, p2) = (pool1(), pool2());
        for path in paths {
            for level in SimdLevel::FASTEST_FIRST {
                let Some(k) = kernel_or_skip(path, level) else {
                    continue;
                };
                for c in cases().into_iter().filter(|c| c.rows > 1) {
                    let mut rng = Rng::new(35);
                    let in_f = c.blocks * c.qt.block_len();
                    let w = random_blocks(&mut rng, c.qt, c.out_f * c.blocks);
                    let m = QuantMatrix::new(c.qt, &w, c.out_f, in_f).unwrap();
                    let x = rng.vec(c.rows * in_f, 1.0);
                    let b = rng.vec(c.out_f, 1.0);
                    let bias = c.bias.then_some(&b[..]);
                    let mut all = vec![f32::NAN; c.rows * c.out_f];
                    quant_linear(k, &x, c.rows, &m, bias, &mut all, &p2);
                    for (t, want) in all.chunks_exact(c.out_f).enumerate() {
                        let mut one = vec![f32::NAN; c.out_f];
                        let xt = &x[t * in_f..(t + 1) * in_f];
                        quant_linear(k, xt, 1, &m, bias, &mut one, &p1);
                        assert_eq!(
                            one, want,
                            "{path:?} {level:?} {} row {t} of {}",
                            c.qt, c.rows
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bad_matrices_are_errors() {
        let err = QuantMatrix::new(QuantType::Q4K, &[0; 144], 1, 128).unwrap_err();
        assert!(matches!(err, Error::UnsupportedDType(_)), "{err}");
        let err = QuantMatrix::new(QuantType::Q8_0, &[0; 34], 2, 32).unwrap_err();
        assert!(matches!(err, Error::SizeMismatch { .. }), "{err}");
        let m = QuantMatrix::new(QuantType::Q8_0, &[0; 68], 2, 32).unwrap();
        assert_eq!((m.rows(), m.cols(), m.row(1).len()), (2, 32, 34));
    }

    #[test]
    fn degenerate_shapes() {
        let pool = pool2();
        let k = QuantKernel::new(QuantPath::F32Activations);
        let m = QuantMatrix::new(QuantType::Q4_0, &[], 3, 0).unwrap();
        let mut y = vec![f32::NAN; 6];
        quant_linear(k, &[], 2, &m, Some(&[1.0, 2.0, 3.0]), &mut y, &pool);
        assert_eq!(y, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
        let m = QuantMatrix::new(QuantType::Q4_0, &[0; 36], 2, 32).unwrap();
        quant_linear(k, &[], 0, &m, None, &mut [], &pool);
    }
}
