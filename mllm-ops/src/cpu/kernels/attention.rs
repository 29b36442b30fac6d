//! Causal scaled-dot-product attention of one sequence over its KV cache.

use rayon::prelude::*;
use rayon::ThreadPool;

use super::kv_rows::KvRows;
use super::matmul::{axpy, dot};
use super::qkernel::SimdLevel;
use super::softmax::softmax_in_place;
use super::PAR_THRESHOLD;

#[cfg(target_arch = "x86_64")]
mod lanes;
#[cfg(target_arch = "x86_64")]
mod multi_head;
#[cfg(test)]
mod tests;
mod tiled;

/// Head layout and masking parameters of [`attention`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads (divides `n_heads`; fewer for GQA/MQA).
    pub n_kv_heads: usize,
    /// Dimension of every head.
    pub head_dim: usize,
    /// Multiplier of `q·k`, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// With `Some(w)`, a query at position `p` sees only keys at positions
    /// `p - w < j <= p` (itself and the `w - 1` previous tokens, as
    /// transformers' sliding-window attention).
    pub sliding_window: Option<usize>,
}

/// Causal attention for the `n_q` query tokens at absolute positions
/// `past..past + n_q` of one sequence.
///
/// * `q` is `[n_q, n_heads * head_dim]`;
/// * `k` and `v` are `[kv_len, n_kv_heads * head_dim]` with
///   `kv_len >= past + n_q`: the whole cache, where rows `0..past + n_q` are
///   valid (rows beyond are ignored);
/// * `out` is `[n_q, n_heads * head_dim]`.
///
/// Query `i` (position `p = past + i`) of head `h` attends to the keys of
/// kv head `h / (n_heads / n_kv_heads)` at positions `j <= p` (and `j > p - w`
/// with a sliding window `w`): `out = softmax(scale · q·kᵀ) · v`, in f32 with
/// max subtraction. Runs in `pool` unless the work is tiny.
///
/// Steps of more than one query (prefill) run the tiled kernel of
/// `tiled`: blocks of queries against blocks of keys with an online
/// softmax. Single-query steps (decode) score one query at a time, split
/// over (query, head-group) pairs (the query heads of one kv head are
/// processed together so that every key and value row is read once per
/// group).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    n_q: usize,
    past: usize,
    k: &[f32],
    v: &[f32],
    shape: &AttnShape,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let row_len = shape.n_kv_heads * shape.head_dim;
    if row_len == 0 {
        return;
    }
    let seq = SeqAttention {
        q,
        n_q,
        past,
        k: KvRows::f32(k, row_len),
        v: KvRows::f32(v, row_len),
    };
    attention_of(&seq, shape, out, pool, true, SimdLevel::FASTEST_FIRST[0]);
}

/// One sequence of an [`attention_batch`] call: its queries, their count,
/// the tokens before them and its KV cache (as for [`attention`], in any
/// storage type).
#[derive(Clone, Copy)]
pub struct SeqAttention<'a> {
    /// `[n_q, n_heads * head_dim]` queries.
    pub q: &'a [f32],
    /// Number of queries.
    pub n_q: usize,
    /// Position of the first query (tokens already cached).
    pub past: usize,
    /// The sequence's cached keys, at least `past + n_q` rows.
    pub k: KvRows<'a>,
    /// The sequence's cached values, at least `past + n_q` rows.
    pub v: KvRows<'a>,
}

impl SeqAttention<'_> {
    /// Query-key pairs scored (the work, up to the head count).
    fn pairs(&self) -> usize {
        self.n_q * (self.past + self.n_q)
    }
}

/// [`attention`] of several sequences, `outs[i]` for `seqs[i]`: when no
/// sequence holds half the work (decode steps of many sequences), the
/// sequences run in parallel, each on one thread, instead of splitting each
/// small one over the pool in turn; otherwise one after another. Every
/// output equals that of an [`attention`] call for its sequence alone.
/// The kernels use at most the SIMD level `max` (as
/// `QuantKernel::capped`: `Avx2` runs what an AVX2-only CPU runs).
pub fn attention_batch(
    seqs: &[SeqAttention<'_>],
    shape: &AttnShape,
    outs: Vec<&mut [f32]>,
    pool: &ThreadPool,
    max: SimdLevel,
) {
    debug_assert_eq!(seqs.len(), outs.len(), "one output per sequence");
    let total: usize = seqs.iter().map(SeqAttention::pairs).sum();
    let largest = seqs.iter().map(SeqAttention::pairs).max().unwrap_or(0);
    if seqs.len() > 1 && pool.current_num_threads() > 1 && 2 * largest < total {
        pool.install(|| {
            seqs.par_iter()
                .zip(outs)
                .for_each(|(seq, out)| attention_of(seq, shape, out, pool, false, max))
        });
        return;
    }
    for (seq, out) in seqs.iter().zip(outs) {
        attention_of(seq, shape, out, pool, true, max);
    }
}

/// [`attention`] of one sequence, split over `pool` only when `may_split`
/// and the work is large enough (the split never changes the results),
/// with SIMD levels up to `max`.
fn attention_of(
    seq: &SeqAttention<'_>,
    shape: &AttnShape,
    out: &mut [f32],
    pool: &ThreadPool,
    may_split: bool,
    // Only x86-64 has attention kernels beyond the portable ones.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] max: SimdLevel,
) {
    let SeqAttention { q, n_q, past, k, v } = *seq;
    let AttnShape {
        n_heads,
        n_kv_heads,
        head_dim,
        scale,
        sliding_window,
    } = *shape;
    let q_stride = n_heads * head_dim;
    let kv_stride = n_kv_heads * head_dim;
    debug_assert!(
        n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
        "n_kv_heads must divide n_heads"
    );
    debug_assert_eq!(
        q.len(),
        n_q * q_stride,
        "q must be [n_q, n_heads * head_dim]"
    );
    debug_assert_eq!(
        out.len(),
        n_q * q_stride,
        "out must be [n_q, n_heads * head_dim]"
    );
    debug_assert!(
        k.rows() >= past + n_q && k.row_len() == kv_stride,
        "k must hold past + n_q rows of n_kv_heads * head_dim"
    );
    debug_assert!(
        v.rows() >= past + n_q && v.row_len() == kv_stride,
        "v must hold past + n_q rows of n_kv_heads * head_dim"
    );
    debug_assert!(
        head_dim.is_multiple_of(k.kind().block_len())
            && head_dim.is_multiple_of(v.kind().block_len()),
        "heads must be whole blocks of the cache type"
    );
    debug_assert!(
        sliding_window != Some(0),
        "a sliding window must be at least 1"
    );
    if n_q == 0 || n_heads == 0 || head_dim == 0 || n_kv_heads == 0 {
        return;
    }
    let group = (n_heads / n_kv_heads).max(1);
    let window = sliding_window.map(|w| w.max(1));
    // First visible key position for the query at position `p`.
    let first_key = move |p: usize| window.map_or(0, |w| (p + 1).saturating_sub(w));

    // Work estimate: two multiply-adds per (query, head, visible key, dim).
    let visible: usize = (0..n_q).map(|i| past + i + 1 - first_key(past + i)).sum();
    let work = visible
        .saturating_mul(n_heads)
        .saturating_mul(head_dim)
        .saturating_mul(2);
    let threads = pool.current_num_threads().max(1);
    let parallel = may_split && threads > 1 && work >= PAR_THRESHOLD;

    if use_tiled(n_q, past) {
        let tiled = tiled::Tiled::new(q, n_q, past, k, v, shape);
        #[cfg(target_arch = "x86_64")]
        if let Some(ops) = tiled::Avx512::detect().filter(|_| SimdLevel::Avx512.at_most(max)) {
            tiled.run(ops, out, pool, parallel);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(ops) = tiled::Avx2::detect().filter(|_| SimdLevel::Avx2.at_most(max)) {
            tiled.run(ops, out, pool, parallel);
            return;
        }
        tiled.run(tiled::Scalar, out, pool, parallel);
        return;
    }

    #[cfg(target_arch = "x86_64")]
    let avx2 = SimdLevel::Avx2.at_most(max)
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    let avx2 = false;
    // One decode over more than a few keys: every task keeps all heads of
    // its kv head (each key and value row read once) and its keys are split
    // into parts instead.
    let split = avx2 && n_q == 1 && head_dim.is_multiple_of(64) && visible > MIN_SPLIT_KEYS;

    // A task handles `hpt` consecutive query heads sharing one kv head, so
    // that each key and value row is loaded once for all of them. Split the
    // groups further only when that is needed to give every thread work.
    let mut hpt = group;
    if parallel && !split {
        for d in 1..=group {
            if group.is_multiple_of(d) {
                hpt = group / d;
                if n_q * n_kv_heads * d >= 4 * threads {
                    break;
                }
            }
        }
    }
    let tasks_per_row = n_heads / hpt;

    let ctx = Task {
        q,
        k,
        v,
        past,
        q_stride,
        head_dim,
        hpt,
        group,
        n_kv_heads,
        tasks_per_row,
        scale,
        window,
    };
    #[cfg(target_arch = "x86_64")]
    if split {
        decode_split(&ctx, out, pool, parallel);
        return;
    }
    let task = |scratch: &mut DecodeScratch, (idx, o): (usize, &mut [f32])| {
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: AVX2, FMA and F16C were detected just above.
            unsafe { simd::task(&ctx, scratch, idx, o) };
            return;
        }
        ctx.run(scratch, idx, o, softmax_in_place);
    };

    if parallel {
        pool.install(|| {
            out.par_chunks_mut(hpt * head_dim)
                .enumerate()
                .for_each_init(DecodeScratch::default, task)
        });
    } else {
        let mut scratch = DecodeScratch::default();
        for item in out.chunks_mut(hpt * head_dim).enumerate() {
            task(&mut scratch, item);
        }
    }
}

/// Keys per part of a long decode (see [`decode_split`]). Parts of 256
/// keys against 1024: SmolLM2 Q4_1 decoded 1.15x faster after 1024 tokens
/// (three parts of 1024 keys on two threads left one idle a third of the
/// time) and 1.05x after 512 (where each query head's task had read its
/// kv head's keys and values again); 128 was no better.
#[cfg(target_arch = "x86_64")]
const PART_KEYS: usize = 256;

/// Visible keys above which a single query is split into parts (see
/// [`decode_split`]); fewer are too little work to share.
const MIN_SPLIT_KEYS: usize = 32;

/// Keys per part of a decode over `len` visible keys: [`PART_KEYS`], or
/// half of them (rounded up to 8) when that makes at most two parts.
/// Decodes over at most 256 keys used to run a task per kv head, or per
/// query head where that gave the threads more tasks, each reading its kv
/// head's slice of every row (each row three times for SmolLM2's nine
/// heads over three kv heads); in two parts SmolLM2's
/// attention ops took 0.82x the time over a 128-token decode and 0.85x
/// after 200 tokens (medians of 8 and 6 alternated runs).
#[cfg(target_arch = "x86_64")]
fn part_keys(len: usize) -> usize {
    if len > 2 * PART_KEYS {
        PART_KEYS
    } else {
        len.div_ceil(2).next_multiple_of(8)
    }
}

/// A single query over more than [`MIN_SPLIT_KEYS`] keys, on AVX2 with
/// heads of a multiple of 64: every part of [`part_keys`] keys is a work
/// item (in `pool` when `parallel`) giving, for every kv head, each of its query
/// heads' partial maximum, sum and weighted values; the parts are then
/// combined in order. A part reads its rows of the cache front to back
/// (see `simd::part`), where one item per (kv head, part) read one head's
/// slice of every row from memory: with that and the key scores' loops
/// inlined (`simd::inline_array`), SmolLM2 Q4_1 decoded 1.05-1.10x faster
/// after 1024 tokens on a Zen 3, 1.16x after 2048, 1.46x after 4096. The
/// parts depend only on the number of visible keys, so the result does
/// not depend on the threads or on other sequences.
#[cfg(target_arch = "x86_64")]
fn decode_split(ctx: &Task<'_>, out: &mut [f32], pool: &ThreadPool, parallel: bool) {
    let (hd, hpt) = (ctx.head_dim, ctx.hpt);
    let tasks = ctx.tasks_per_row;
    let len = ctx.span(0).len;
    let part_keys = part_keys(len);
    let parts = len.div_ceil(part_keys);
    let item = ctx.part_len();
    let mut partial = vec![0.0f32; tasks * parts * item];
    let run = |scratch: &mut DecodeScratch, (p, o): (usize, &mut [f32])| {
        let keys = p * part_keys..((p + 1) * part_keys).min(len);
        // SAFETY: the caller checked AVX2, FMA and F16C.
        unsafe { simd::part(ctx, scratch, keys, o) };
    };
    if parallel {
        pool.install(|| {
            partial
                .par_chunks_mut(tasks * item)
                .enumerate()
                .for_each_init(DecodeScratch::default, run)
        });
    } else {
        let mut scratch = DecodeScratch::default();
        partial
            .chunks_mut(tasks * item)
            .enumerate()
            .for_each(|x| run(&mut scratch, x));
    }
    for (idx, o) in out.chunks_exact_mut(hpt * hd).enumerate() {
        for (h, oh) in o.chunks_exact_mut(hd).enumerate() {
            // Head `h`'s maximum, sum and weighted values in part `p`.
            let part = |p: usize| {
                let it = &partial[(p * tasks + idx) * item..][..item];
                (it[h], it[hpt + h], &it[2 * hpt + h * hd..][..hd])
            };
            let max = (0..parts)
                .map(|p| part(p).0)
                .fold(f32::NEG_INFINITY, f32::max);
            oh.fill(0.0);
            let mut sum = 0.0f32;
            for p in 0..parts {
                let (m, l, acc) = part(p);
                let w = (m - max).exp();
                sum += l * w;
                for (x, a) in oh.iter_mut().zip(acc) {
                    *x += a * w;
                }
            }
            let inv = 1.0 / sum;
            for x in oh.iter_mut() {
                *x *= inv;
            }
        }
    }
}

/// Whether a step of `n_q` queries after `past` cached tokens takes the
/// tiled kernel: every step of more than one query does (positions must fit
/// `i32`). A query's tiled result depends only on its position, its values
/// and the keys (see [`tiled`]), so a prompt gives the same bits however it
/// is cut into chunks, which prefix reuse in a server relies on.
fn use_tiled(n_q: usize, past: usize) -> bool {
    n_q > 1 && past + n_q <= i32::MAX as usize
}

/// Keys (or values) a decode task decodes at a time.
const TILE_KEYS: usize = 64;

/// The buffers of one decode thread.
#[derive(Default)]
struct DecodeScratch {
    /// Scores, then probabilities, `[hpt][len]`.
    scores: Vec<f32>,
    /// One decoded tile of keys or values (unused for an f32 cache).
    tile: Vec<f32>,
}

/// Everything one attention task reads.
struct Task<'a> {
    q: &'a [f32],
    k: KvRows<'a>,
    v: KvRows<'a>,
    past: usize,
    q_stride: usize,
    head_dim: usize,
    hpt: usize,
    group: usize,
    n_kv_heads: usize,
    tasks_per_row: usize,
    scale: f32,
    window: Option<usize>,
}

/// What task `idx` reads: its `hpt` query heads, its kv head and the
/// positions of the keys it sees.
struct Span<'a> {
    /// The task's query heads, `hpt · head_dim` values.
    qrow: &'a [f32],
    /// The kv head they share.
    kvh: usize,
    /// First visible key position.
    lo: usize,
    /// Number of visible keys (positions `lo..lo + len`).
    len: usize,
}

impl<'a> Task<'a> {
    /// Values one task's share of a split decode part holds (see
    /// `simd::part`): `hpt` maxima, `hpt` sums, `hpt × head_dim` values.
    #[cfg(target_arch = "x86_64")]
    fn part_len(&self) -> usize {
        self.hpt * (self.head_dim + 2)
    }

    /// The query heads, kv head and visible keys of task `idx`: query
    /// `idx / tasks_per_row`, `hpt` heads of one kv head.
    #[inline(always)]
    fn span(&self, idx: usize) -> Span<'a> {
        let i = idx / self.tasks_per_row;
        let h0 = (idx % self.tasks_per_row) * self.hpt;
        let p = self.past + i;
        let lo = self.window.map_or(0, |w| (p + 1).saturating_sub(w));
        Span {
            qrow: &self.q[i * self.q_stride + h0 * self.head_dim..][..self.hpt * self.head_dim],
            kvh: (h0 / self.group).min(self.n_kv_heads - 1),
            lo,
            len: p + 1 - lo,
        }
    }

    /// Task `idx` (see [`Task::span`]), written to `o`; `softmax`
    /// normalizes one row of scores in place.
    #[inline(always)]
    fn run(
        &self,
        scratch: &mut DecodeScratch,
        idx: usize,
        o: &mut [f32],
        softmax: impl Fn(&mut [f32]),
    ) {
        let Span { qrow, kvh, lo, len } = self.span(idx);
        let (hd, off) = (self.head_dim, kvh * self.head_dim);
        let DecodeScratch { scores, tile: buf } = scratch;
        scores.clear();
        scores.resize(self.hpt * len, 0.0);
        for t0 in (0..len).step_by(TILE_KEYS) {
            let t1 = (t0 + TILE_KEYS).min(len);
            let keys = self.k.head_tile(lo + t0..lo + t1, off, hd, buf);
            for jj in t0..t1 {
                let krow = keys.row(jj - t0, hd);
                for (hh, qh) in qrow.chunks_exact(hd).enumerate() {
                    scores[hh * len + jj] = dot(qh, krow) * self.scale;
                }
            }
        }
        for row in scores.chunks_exact_mut(len) {
            softmax(row);
        }
        o.fill(0.0);
        for t0 in (0..len).step_by(TILE_KEYS) {
            let t1 = (t0 + TILE_KEYS).min(len);
            let values = self.v.head_tile(lo + t0..lo + t1, off, hd, buf);
            for jj in t0..t1 {
                let vrow = values.row(jj - t0, hd);
                for (hh, oh) in o.chunks_exact_mut(hd).enumerate() {
                    axpy(scores[hh * len + jj], vrow, oh);
                }
            }
        }
    }
}

/// The attention task compiled for AVX2 + FMA + F16C with a vectorized
/// softmax: for head dimensions that are multiples of 64, the scores and
/// weighted values of [`multi_head`] (up to three query heads per pass
/// over the rows); otherwise `Task::run` (whose portable dot and axpy loops
/// vectorize 8 wide).
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{multi_head, DecodeScratch, Span, Task, TILE_KEYS};
    use crate::cpu::kernels::kv_rows::InPlace;

    /// Runs task `idx` (see `Task::run`), one tile of keys (then values)
    /// at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn task(ctx: &Task<'_>, scratch: &mut DecodeScratch, idx: usize, o: &mut [f32]) {
        let hd = ctx.head_dim;
        if !hd.is_multiple_of(64) {
            ctx.run(scratch, idx, o, |row| softmax(row));
            return;
        }
        let span = ctx.span(idx);
        let DecodeScratch { scores, tile: buf } = scratch;
        scores.clear();
        scores.resize(ctx.hpt * span.len, 0.0);
        score_keys(ctx, &span, 0..span.len, scores, buf);
        for row in scores.chunks_exact_mut(span.len) {
            softmax(row);
        }
        o.fill(0.0);
        add_values(ctx, &span, 0..span.len, scores, buf, o);
    }

    /// One part of a split decode (see `super::decode_split`): over the
    /// visible keys `part`, for every task (kv head), each of its heads'
    /// largest score, its sum of `exp(score − max)` and the values
    /// weighted by those exponentials, written to `out` task after task as
    /// `[max; hpt]`, `[sum; hpt]`, then `[hpt][hd]` weighted values. The
    /// head dimension is a multiple of 64.
    ///
    /// The tasks take turns tile by tile, so the part's key rows, then its
    /// value rows, are read front to back once, whole rows at a time:
    /// task by task, each would read one head's slice of every row, a
    /// stride the prefetchers do not follow, from memory (a decode step's
    /// weights have pushed the cache out of the caches). Each tile's rows
    /// are first streamed in whole (`KvRows::stream_rows`): SmolLM2's
    /// attention ops then took 0.68x the time after 1024 tokens (its whole
    /// decode 1.19x as fast) and the 1.1B model's 0.58x.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn part(
        ctx: &Task<'_>,
        scratch: &mut DecodeScratch,
        part: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        let (hpt, tasks) = (ctx.hpt, ctx.tasks_per_row);
        let n = part.len();
        let item = ctx.part_len();
        let DecodeScratch { scores, tile: buf } = scratch;
        scores.clear();
        scores.resize(tasks * hpt * n, 0.0);
        // Task `idx`'s view of the part; its scores are laid out `[hpt][n]`.
        let local = |idx: usize| {
            let span = ctx.span(idx);
            Span {
                lo: span.lo + part.start,
                len: n,
                ..span
            }
        };
        let lo = local(0).lo;
        for t0 in (0..n).step_by(TILE_KEYS) {
            let t1 = (t0 + TILE_KEYS).min(n);
            ctx.k.stream_rows(lo + t0..lo + t1);
            for (idx, task_scores) in scores.chunks_exact_mut(hpt * n).enumerate() {
                score_keys(ctx, &local(idx), t0..t1, task_scores, buf);
            }
        }
        for (task_scores, o) in scores
            .chunks_exact_mut(hpt * n)
            .zip(out.chunks_exact_mut(item))
        {
            let (maxes, rest) = o.split_at_mut(hpt);
            let (sums, acc) = rest.split_at_mut(hpt);
            for ((row, max), sum) in task_scores.chunks_exact_mut(n).zip(maxes).zip(sums) {
                *max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                *sum = exp_sum(row, *max);
            }
            acc.fill(0.0);
        }
        for t0 in (0..n).step_by(TILE_KEYS) {
            let t1 = (t0 + TILE_KEYS).min(n);
            ctx.v.stream_rows(lo + t0..lo + t1);
            for (idx, (probs, o)) in scores
                .chunks_exact(hpt * n)
                .zip(out.chunks_exact_mut(item))
                .enumerate()
            {
                add_values(ctx, &local(idx), t0..t1, probs, buf, &mut o[2 * hpt..]);
            }
        }
    }

    /// `scores[h * span.len + j] = scale · q_h · k_j` for the keys `keys`
    /// (relative to `span.lo`) of the task's heads: f32 and f16 rows read
    /// in place, other types one decoded tile at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn score_keys(
        ctx: &Task<'_>,
        span: &Span<'_>,
        keys: std::ops::Range<usize>,
        scores: &mut [f32],
        buf: &mut Vec<f32>,
    ) {
        let (hd, len, scale) = (ctx.head_dim, span.len, ctx.scale);
        let off = span.kvh * hd;
        let q = span.qrow;
        let rows = span.lo + keys.start..span.lo + keys.end;
        if let Some(runs) = ctx.k.in_place(rows, off) {
            for (run, tile) in runs {
                let (n, j0) = (run.len(), run.start - span.lo);
                match tile {
                    InPlace::F32(t) => multi_head::scores(q, hd, t, n, scale, scores, len, j0),
                    InPlace::F16(t) => multi_head::scores(q, hd, t, n, scale, scores, len, j0),
                }
            }
            return;
        }
        for t0 in keys.clone().step_by(TILE_KEYS) {
            let t1 = (t0 + TILE_KEYS).min(keys.end);
            let tile = ctx.k.head_tile(span.lo + t0..span.lo + t1, off, hd, buf);
            multi_head::scores(q, hd, tile, t1 - t0, scale, scores, len, t0);
        }
    }

    /// `o_h += Σ_j probs[h * span.len + j] · v_j` over the keys `keys`
    /// (relative to `span.lo`): f32 and f16 rows read in place, other types
    /// one decoded tile at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn add_values(
        ctx: &Task<'_>,
        span: &Span<'_>,
        keys: std::ops::Range<usize>,
        probs: &[f32],
        buf: &mut Vec<f32>,
        o: &mut [f32],
    ) {
        let (hd, len) = (ctx.head_dim, span.len);
        let off = span.kvh * hd;
        let rows = span.lo + keys.start..span.lo + keys.end;
        if let Some(runs) = ctx.v.in_place(rows, off) {
            for (run, tile) in runs {
                let (n, j0) = (run.len(), run.start - span.lo);
                match tile {
                    InPlace::F32(t) => multi_head::add_values(probs, len, j0, t, n, o, hd),
                    InPlace::F16(t) => multi_head::add_values(probs, len, j0, t, n, o, hd),
                }
            }
            return;
        }
        for t0 in keys.clone().step_by(TILE_KEYS) {
            let t1 = (t0 + TILE_KEYS).min(keys.end);
            let values = ctx.v.head_tile(span.lo + t0..span.lo + t1, off, hd, buf);
            multi_head::add_values(probs, len, t0, values, t1 - t0, o, hd);
        }
    }

    pub(super) use crate::cpu::kernels::simd::vmath::exp8;

    /// Numerically stable softmax of one row, in place, with [`exp8`]
    /// (the row must not be all `-inf`).
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn softmax(row: &mut [f32]) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            row.fill(0.0);
            return;
        }
        let inv = 1.0 / exp_sum(row, max);
        for v in row.iter_mut() {
            *v *= inv;
        }
    }

    /// Replaces every `x` of `row` by `exp(x − max)` ([`exp8`]) and returns
    /// their sum (`max` finite).
    #[target_feature(enable = "avx2,fma")]
    fn exp_sum(row: &mut [f32], max: f32) -> f32 {
        let m = _mm256_set1_ps(max);
        let mut sum = _mm256_setzero_ps();
        let mut chunks = row.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: `c` holds 8 floats; `loadu`/`storeu` have no
            // alignment requirement.
            unsafe {
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), m));
                _mm256_storeu_ps(c.as_mut_ptr(), e);
                sum = _mm256_add_ps(sum, e);
            }
        }
        let tail = chunks.into_remainder();
        let mut buf = [f32::NEG_INFINITY; 8];
        buf[..tail.len()].copy_from_slice(tail);
        // SAFETY: `buf` holds 8 floats; `loadu`/`storeu` have no alignment
        // requirement.
        unsafe {
            // Padding lanes are -inf: exp8 clamps them to e^-88 − keep them
            // out of the sum by zeroing after the call.
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), m));
            _mm256_storeu_ps(buf.as_mut_ptr(), e);
        }
        buf[tail.len()..].fill(0.0);
        tail.copy_from_slice(&buf[..tail.len()]);
        let mut s = [0.0f32; 8];
        // SAFETY: `s` holds 8 floats.
        unsafe { _mm256_storeu_ps(s.as_mut_ptr(), sum) };
        s.iter().sum::<f32>() + buf.iter().sum::<f32>()
    }
}
