//! The linear-layer frame of every packed format: activation rows
//! quantized once per call, then the format's kernels run over spans of
//! row groups, tiles of activation rows and the pool's threads, each
//! output row written in runs of columns.

use rayon::prelude::*;
use rayon::ThreadPool;

#[cfg(target_arch = "x86_64")]
use super::WIDE_TILE_TOKENS;
use super::{
    PackedData, PackedFormat, RowOutputs, WeightReads, GROUP_ROWS, ROW_BLOCK, SPAN_WEIGHT_BYTES,
    TILE_TOKENS,
};
use crate::cpu::kernels::activation::glu;
use crate::cpu::kernels::qact::{ActivationScratch, BlockScales, Q16Act, Q16Row, BLOCK};
use crate::cpu::kernels::qkernel::{QuantKernel, SimdLevel};
use crate::cpu::kernels::qmatmul::{add_bias_rows, Split};

/// [`packed_linear`] over the packed matrix `w` of any format `F` whose
/// kernels take the activation rows split at `SHIFT` as they are (Q4 and
/// Q5 at [`WIDE`], Q4_K and Q5_K at [`WIDE`] or `BYTE`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn wide_packed_linear<F, const SHIFT: u32>(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &PackedData,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
    scratch: &ActivationScratch,
) where
    F: for<'a> PackedFormat<Input<'a> = Q16Row<'a, SHIFT>>,
{
    let in_f = w.cols();
    by_row_blocks(w, x, rows, bias, y, pool, |xb, split, yt| {
        quantize_rows::<SHIFT>(k, (xb, in_f, F::PER_SCALE), split, scratch, |xs| {
            packed_group_outputs::<F>(k, w, xs, split, yt);
        });
    });
}

/// The frame of a packed linear layer over the `[w_rows, in_f]` matrix
/// `w`, `out_f` outputs per row (`w_rows`, or half of them for gated
/// outputs, see [`RowOutputs`]): `product(x rows, split, out)` writes the
/// outputs of the given activation rows into `out` (`[rows, out_f]`);
/// this runs it over blocks of at most [`ROW_BLOCK`] rows of `y` and adds
/// the bias (`out_f` values; none for gated outputs).
pub(crate) fn by_row_blocks(
    w: &PackedData,
    x: &[f32],
    rows: usize,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
    product: impl Fn(&[f32], &Split<'_>, &mut [f32]) + Sync,
) {
    let (in_f, w_rows, outputs) = (w.cols(), w.rows(), w.outputs());
    let out_f = w_rows / outputs.rows_per_output();
    debug_assert_eq!(x.len(), rows * in_f, "x must be [rows, in_f]");
    debug_assert_eq!(y.len(), rows * out_f, "y must be [rows, out_f]");
    debug_assert!(
        bias.is_none() || outputs == RowOutputs::Each,
        "no bias with gated outputs"
    );
    if rows == 0 || out_f == 0 {
        return;
    }
    let split = Split::new(pool, rows * in_f * w_rows);
    let mut run = || {
        for (xb, yb) in x
            .chunks(ROW_BLOCK * in_f)
            .zip(y.chunks_mut(ROW_BLOCK * out_f))
        {
            product(xb, &split, yb);
        }
    };
    // One hand-over to the pool for the whole call: the quantization and
    // the products of every row block then split from a worker.
    match split.pool() {
        Some(pool) => pool.install(run),
        None => run(),
    }
    add_bias_rows(y, out_f, bias);
}

/// Values below which quantizing activations is not worth a fork-join
/// (a step of a few dozen tokens quantizes in microseconds).
const PAR_QUANTIZE_VALUES: usize = 1 << 15;

/// The pool and the rows per task of a pass over `rows` activation rows
/// of `in_f` values each, split by rows: `None` (one thread) unless the
/// call is parallel and has many values.
fn row_tasks<'p>(split: &Split<'p>, rows: usize, in_f: usize) -> Option<(&'p ThreadPool, usize)> {
    let pool = split
        .pool()
        .filter(|_| rows * in_f >= PAR_QUANTIZE_VALUES.max(2 * in_f))?;
    Some((pool, rows.div_ceil(4 * pool.current_num_threads()).max(1)))
}

/// Quantizes the rows of `x` (each `in_f` long) to 16 bits with the plane
/// split `SHIFT`, one scale per `per_scale` values (see
/// `qact::quantize_q16_into`), into the buffers of `scratch` (rows one
/// `qact::row_stride` apart), split over the pool by rows when the call
/// is parallel and has many values, calls `use_rows` with them and puts
/// the buffers back.
pub(crate) fn quantize_rows<const SHIFT: u32>(
    k: QuantKernel,
    (x, in_f, per_scale): (&[f32], usize, usize),
    split: &Split<'_>,
    scratch: &ActivationScratch,
    use_rows: impl FnOnce(&[Q16Row<'_, SHIFT>]),
) {
    let rows = x.len() / in_f;
    let mut act = Q16Act::rows_in_buffers(rows, in_f, scratch.take());
    let (stride, nb) = (act.stride(), in_f / BLOCK);
    let (hi, lo, scales) = act.parts_mut();
    let quantize = |hi: &mut [i8], lo: &mut [i8], scales: BlockScales<'_>, x: &[f32]| {
        let planes = hi.chunks_mut(stride).zip(lo.chunks_mut(stride));
        let per_row = scales
            .d
            .chunks_mut(nb)
            .zip(scales.s.chunks_mut(nb))
            .zip(scales.sums.chunks_mut(nb));
        for (((hi, lo), ((d, s), sums)), x) in planes.zip(per_row).zip(x.chunks(in_f)) {
            let row_scales = BlockScales { d, s, sums };
            k.quantize_act16_into::<SHIFT>(
                x,
                &mut hi[..in_f],
                &mut lo[..in_f],
                row_scales,
                per_scale,
            );
        }
    };
    match row_tasks(split, rows, in_f) {
        None => quantize(hi, lo, scales, x),
        Some((pool, per_task)) => {
            let (bytes, blocks) = (per_task * stride, per_task * nb);
            let BlockScales { d, s, sums } = scales;
            let parts = hi
                .par_chunks_mut(bytes)
                .zip(lo.par_chunks_mut(bytes))
                .zip(d.par_chunks_mut(blocks))
                .zip(s.par_chunks_mut(blocks))
                .zip(sums.par_chunks_mut(blocks))
                .zip(x.par_chunks(per_task * in_f));
            pool.install(|| {
                parts.for_each(|(((((hi, lo), d), s), sums), x)| {
                    quantize(hi, lo, BlockScales { d, s, sums }, x)
                })
            });
        }
    }
    use_rows(&act.rows());
    scratch.put(act.into_buffers());
}

/// Fills `out`, `per_row` items for each of the activation `rows` (of
/// `in_f` values each), by `fill(row, its items)`: split by rows over the
/// pool as [`quantize_rows`] is.
pub(crate) fn fill_by_rows<R: Sync, T: Send>(
    split: &Split<'_>,
    in_f: usize,
    rows: &[R],
    per_row: usize,
    out: &mut [T],
    fill: impl Fn(&R, &mut [T]) + Sync,
) {
    let fill_rows = |rows: &[R], out: &mut [T]| {
        for (row, items) in rows.iter().zip(out.chunks_mut(per_row)) {
            fill(row, items)
        }
    };
    let Some((pool, per_task)) = row_tasks(split, rows.len(), in_f) else {
        return fill_rows(rows, out);
    };
    pool.install(|| {
        out.par_chunks_mut(per_task * per_row)
            .zip(rows.par_chunks(per_task))
            .for_each(|(out, rows)| fill_rows(rows, out))
    });
}

/// Writes the outputs of every row group (`groups(g, n)`: the `n` groups
/// from `g` on, each of `cols` weights per row, whose products give the
/// outputs that come with them, see [`RowOutputs`]) for the activation
/// rows `xs` into `dst` (`[xs.len(), out_f]`, row-major), parallel over blocks
/// of groups, each task writing its columns of every row; `dot`
/// multiplies one or two consecutive groups with one to `tile` rows
/// (outputs of the second group after those of the first):
/// [`TILE_TOKENS`], or [`packed_half::HALF_TILE_TOKENS`] for the float
/// layout.
///
/// A task goes through its groups a span at a time ([`SPAN_WEIGHT_BYTES`]),
/// every tile of rows over the whole span, so that each output row is
/// written in runs of consecutive columns while the span's weights stay in
/// cache. `dot` is told which tile reads a span from memory (the first
/// over it) and which find it in cache ([`WeightReads`]).
///
/// [`packed_half::HALF_TILE_TOKENS`]: super::packed_half::HALF_TILE_TOKENS
pub(crate) fn group_outputs<'g, A: Sync>(
    groups: (&(impl Fn(usize, usize) -> &'g [u8] + Sync), RowOutputs),
    cols: usize,
    xs: &[A],
    tile: usize,
    split: &Split<'_>,
    dst: &mut [f32],
    dot: impl Fn(&[u8], &[A], &mut [[f32; GROUP_ROWS]], WeightReads) + Sync + Send,
) {
    outputs_by_calls(groups, cols, xs, tile, None, split, dst, dot)
}

/// [`group_outputs`] with `dot` called once per span (of about
/// `span_bytes` of weights) and tile of rows, with all the span's groups
/// (outputs group after group): for kernels with a fixed cost per call
/// (the AMX level's tile configuration).
#[cfg(target_arch = "x86_64")]
pub(crate) fn group_outputs_by_spans<'g, A: Sync>(
    groups: (&(impl Fn(usize, usize) -> &'g [u8] + Sync), RowOutputs),
    cols: usize,
    xs: &[A],
    (tile, span_bytes): (usize, usize),
    split: &Split<'_>,
    dst: &mut [f32],
    dot: impl Fn(&[u8], &[A], &mut [[f32; GROUP_ROWS]], WeightReads) + Sync + Send,
) {
    outputs_by_calls(groups, cols, xs, tile, Some(span_bytes), split, dst, dot)
}

/// [`group_outputs`], calling `dot` with a span's groups two at a time,
/// or all at once with `whole_spans` (the bytes of weights per span).
/// Gated outputs go through a per-thread stage: each row's gate and up
/// products of a span, then `act(gate) · up` of them into the row at once.
#[allow(clippy::too_many_arguments)]
fn outputs_by_calls<'g, A: Sync>(
    (groups, outputs): (&(impl Fn(usize, usize) -> &'g [u8] + Sync), RowOutputs),
    cols: usize,
    xs: &[A],
    tile: usize,
    whole_spans: Option<usize>,
    split: &Split<'_>,
    dst: &mut [f32],
    dot: impl Fn(&[u8], &[A], &mut [[f32; GROUP_ROWS]], WeightReads) + Sync + Send,
) {
    let Some(out_f) = dst.len().checked_div(xs.len()) else {
        return;
    };
    let rows_per_output = outputs.rows_per_output();
    let per_task = split
        .outputs_per_task(rows_per_output * out_f, cols, xs.len())
        .div_ceil(GROUP_ROWS)
        .next_multiple_of(2);
    split.for_column_blocks(
        dst,
        out_f,
        per_task * GROUP_ROWS / rows_per_output,
        || (vec![[0.0f32; GROUP_ROWS]; 2 * tile], Vec::new()),
        |(tile_out, stage), c, rows_out| {
            let task_groups = rows_per_output * rows_out[0].len() / GROUP_ROWS;
            let pair_bytes = 2 * groups(c * per_task, 1).len();
            let span_bytes = whole_spans.unwrap_or(SPAN_WEIGHT_BYTES);
            let span = 2 * (span_bytes / pair_bytes.max(1)).max(1);
            let per_call = if whole_spans.is_some() { span } else { 2 };
            for first in (0..task_groups).step_by(span) {
                let last = task_groups.min(first + span);
                let staged = (last - first) / 2 * GROUP_ROWS;
                if let RowOutputs::Gated(_) = outputs {
                    stage.resize(2 * staged * xs.len(), 0.0);
                }
                for (ti, rows) in xs.chunks(tile).enumerate() {
                    let rows_out = &mut rows_out[ti * tile..];
                    let reads = WeightReads::FromMemory.of_pass(ti);
                    for call in (first..last).step_by(per_call) {
                        let n = per_call.min(last - call);
                        if tile_out.len() < n * rows.len() {
                            tile_out.resize(n * rows.len(), [0.0; GROUP_ROWS]);
                        }
                        let out = &mut tile_out[..n * rows.len()];
                        dot(groups(c * per_task + call, n), rows, out, reads);
                        let group_out = |gi: usize, t: usize| &out[gi * rows.len() + t];
                        if let RowOutputs::Gated(_) = outputs {
                            // Row by row, gate products then up products.
                            let at = (call - first) / 2 * GROUP_ROWS;
                            let stage = &mut stage[2 * staged * ti * tile..];
                            for (t, row) in stage
                                .chunks_exact_mut(2 * staged)
                                .take(rows.len())
                                .enumerate()
                            {
                                let (gate, up) = row.split_at_mut(staged);
                                let pairs = gate[at..at + n / 2 * GROUP_ROWS]
                                    .chunks_exact_mut(GROUP_ROWS)
                                    .zip(up[at..].chunks_exact_mut(GROUP_ROWS));
                                for (p, (g, u)) in pairs.enumerate() {
                                    g.copy_from_slice(group_out(2 * p, t));
                                    u.copy_from_slice(group_out(2 * p + 1, t));
                                }
                            }
                            continue;
                        }
                        // Row by row, so that each row's outputs are written
                        // in one run (the rows lie far apart in `dst`).
                        let at = call * GROUP_ROWS;
                        for (t, row_out) in rows_out.iter_mut().take(rows.len()).enumerate() {
                            let row_out = &mut row_out[at..at + n * GROUP_ROWS];
                            for (gi, o) in row_out.chunks_exact_mut(GROUP_ROWS).enumerate() {
                                o.copy_from_slice(group_out(gi, t));
                            }
                        }
                    }
                }
                if let RowOutputs::Gated(act) = outputs {
                    let at = first / 2 * GROUP_ROWS;
                    for (row, row_out) in stage.chunks_exact(2 * staged).zip(rows_out.iter_mut()) {
                        let (gate, up) = row.split_at(staged);
                        glu(act, gate, up, &mut row_out[at..at + staged]);
                    }
                }
            }
        },
    );
}

/// [`group_outputs`] over the groups of `w`, of the packed format `F`, [`TILE_TOKENS`]
/// rows per tile ([`PackedFormat::PAIR_TILE_TOKENS`] at the AVX-512
/// level), each through `k`'s group products.
pub(crate) fn packed_group_outputs<F: PackedFormat>(
    k: QuantKernel,
    w: &PackedData,
    xs: &[F::Input<'_>],
    split: &Split<'_>,
    dst: &mut [f32],
) {
    let cols = w.cols();
    let groups = (&|g, n| w.groups(g, n), w.outputs());
    let dot = |g: &[u8], xs: &[F::Input<'_>], out: &mut [[f32; GROUP_ROWS]], reads| {
        k.packed_dot::<F>(g, xs, out, reads)
    };
    let tile = match k.level() {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Amx if F::AMX => {
            let tile = (F::amx_rows(cols), F::amx_span_bytes(cols));
            return group_outputs_by_spans(groups, cols, xs, tile, split, dst, dot);
        }
        // One row (decode): a span of groups per call, for the formats'
        // row runs (`PackedFormat::avx2_row_run`); the others take the
        // span pair by pair.
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 if xs.len() == 1 => {
            let tile = (1, SPAN_WEIGHT_BYTES);
            return group_outputs_by_spans(groups, cols, xs, tile, split, dst, dot);
        }
        SimdLevel::Avx512 | SimdLevel::Amx => F::PAIR_TILE_TOKENS,
        _ => TILE_TOKENS,
    };
    group_outputs(groups, cols, xs, tile, split, dst, dot);
}

/// [`PackedFormat::vnni_pair`] of any number of activation rows,
/// [`PackedFormat::PAIR_TILE_TOKENS`] at a time, with the outputs where one
/// call would put them: `out[t]` for `a`, `out[xs.len() + t]` for `b`.
///
/// # Safety
/// As [`PackedFormat::vnni`].
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn vnni_pair_in_chunks<F: PackedFormat>(
    a: &[u8],
    b: &[u8],
    xs: &[F::Input<'_>],
    out: &mut [[f32; GROUP_ROWS]],
    reads: WeightReads,
) {
    let n = xs.len();
    if n <= F::PAIR_TILE_TOKENS {
        // SAFETY: the caller guarantees the features.
        return unsafe { F::vnni_pair(a, b, xs, out, reads) };
    }
    let mut part = [[0.0f32; GROUP_ROWS]; 2 * WIDE_TILE_TOKENS];
    for (pass, rows) in xs.chunks(F::PAIR_TILE_TOKENS).enumerate() {
        let (first, len) = (pass * F::PAIR_TILE_TOKENS, rows.len());
        // SAFETY: the caller guarantees the features.
        unsafe { F::vnni_pair(a, b, rows, &mut part[..2 * len], reads.of_pass(pass)) };
        out[first..first + len].copy_from_slice(&part[..len]);
        out[n + first..n + first + len].copy_from_slice(&part[len..2 * len]);
    }
}

/// The two groups of `groups` when it holds exactly two of `group_bytes`
/// each (for the kernels that take two groups per pass, all x86-64 ones).
#[cfg(target_arch = "x86_64")]
pub(crate) fn as_pair(groups: &[u8], group_bytes: usize) -> Option<(&[u8], &[u8])> {
    (group_bytes > 0 && groups.len() == 2 * group_bytes).then(|| groups.split_at(group_bytes))
}

/// Runs `dot(group, rows, out, reads)` for each of the two groups `pair`
/// and each tile of at most `tile` of the activation rows `xs`: the
/// default two-group products of a [`PackedFormat`], one group at a time
/// (the outputs of the second group after those of the first). A group's
/// first tile reads as `reads`, its later ones from the cache.
#[cfg(target_arch = "x86_64")]
pub(super) fn each_of_pair<A>(
    pair: [&[u8]; 2],
    xs: &[A],
    tile: usize,
    out: &mut [[f32; GROUP_ROWS]],
    reads: WeightReads,
    mut dot: impl FnMut(&[u8], &[A], &mut [[f32; GROUP_ROWS]], WeightReads),
) {
    if xs.is_empty() {
        return;
    }
    for (group, out) in pair.into_iter().zip(out.chunks_mut(xs.len())) {
        let tiles = xs.chunks(tile).zip(out.chunks_mut(tile));
        for (pass, (xs, out)) in tiles.enumerate() {
            dot(group, xs, out, reads.of_pass(pass));
        }
    }
}

/// Runs `dot(group, out)` over each group of `group_bytes` in `groups`,
/// with `rows` outputs per group in `out` (group after group); with no
/// bytes per group (no columns) every output is zero.
pub(crate) fn each_group(
    groups: &[u8],
    group_bytes: usize,
    rows: usize,
    out: &mut [[f32; GROUP_ROWS]],
    mut dot: impl FnMut(&[u8], &mut [[f32; GROUP_ROWS]]),
) {
    if group_bytes == 0 {
        out.fill([0.0; GROUP_ROWS]);
        return;
    }
    for (group, out) in groups.chunks_exact(group_bytes).zip(out.chunks_mut(rows)) {
        dot(group, out);
    }
}
