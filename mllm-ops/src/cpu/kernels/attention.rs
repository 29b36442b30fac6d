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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::{assert_close, bits, pool1, pool2, Rng};

    /// No cap on the SIMD level.
    const FASTEST: SimdLevel = SimdLevel::FASTEST_FIRST[0];

    /// `n_heads` query heads over `n_kv_heads` of `head_dim`, scaled by
    /// `1/√head_dim`, with a sliding `window` or none.
    fn shape(
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        window: Option<usize>,
    ) -> AttnShape {
        AttnShape {
            n_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window: window,
        }
    }

    /// Random queries (`n_q` rows, spread 2), keys (`kv_len` rows, spread
    /// 2) and values (`kv_len` rows, spread 1) for `s`, drawn in that order.
    fn random_qkv(
        rng: &mut Rng,
        s: &AttnShape,
        n_q: usize,
        kv_len: usize,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let kv_row = s.n_kv_heads * s.head_dim;
        let q = rng.vec(n_q * s.n_heads * s.head_dim, 2.0);
        let k = rng.vec(kv_len * kv_row, 2.0);
        let v = rng.vec(kv_len * kv_row, 1.0);
        (q, k, v)
    }

    /// The AVX2 softmax agrees with the portable one within 1e-6 of each
    /// probability (plus relative 1e-5), on rows with tails and large ranges.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_softmax_matches_scalar() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("skipping: no AVX2/FMA");
            return;
        }
        let mut rng = Rng::new(41);
        for n in [1, 5, 8, 13, 64, 257] {
            for spread in [0.1, 5.0, 60.0] {
                let x = rng.vec(n, spread);
                let mut want = x.clone();
                softmax_in_place(&mut want);
                let mut got = x;
                // SAFETY: AVX2 and FMA were detected above.
                unsafe { simd::softmax(&mut got) };
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-6 + 1e-5 * w.abs(), "n={n}: {g} vs {w}");
                }
            }
        }
        // exp8 over a range of arguments: relative error below 1e-6.
        for i in 0..=200 {
            let x = -87.0 + i as f32 * 0.435;
            let mut out = [0.0f32; 8];
            // SAFETY: AVX2 and FMA were detected above; `out` holds 8 floats.
            unsafe {
                use std::arch::x86_64::*;
                _mm256_storeu_ps(out.as_mut_ptr(), simd::exp8(_mm256_set1_ps(x)));
            }
            let want = (x as f64).exp();
            assert!(
                ((out[0] as f64 - want) / want).abs() < 1e-6,
                "exp({x}) = {}",
                out[0]
            );
        }
    }

    /// Naive f64 reference over the whole prefix.
    fn reference(
        q: &[f32],
        n_q: usize,
        past: usize,
        k: &[f32],
        v: &[f32],
        s: &AttnShape,
    ) -> Vec<f64> {
        let (hd, nh, nkv) = (s.head_dim, s.n_heads, s.n_kv_heads);
        let mut out = vec![0.0f64; n_q * nh * hd];
        for i in 0..n_q {
            let p = past + i;
            for h in 0..nh {
                let kvh = h / (nh / nkv);
                let keys: Vec<usize> = (0..=p)
                    .filter(|&j| s.sliding_window.is_none_or(|w| j + w > p))
                    .collect();
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        (0..hd)
                            .map(|d| {
                                q[i * nh * hd + h * hd + d] as f64
                                    * k[j * nkv * hd + kvh * hd + d] as f64
                            })
                            .sum::<f64>()
                            * s.scale as f64
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|&x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    out[i * nh * hd + h * hd + d] = keys
                        .iter()
                        .zip(&e)
                        .map(|(&j, &w)| w / z * v[j * nkv * hd + kvh * hd + d] as f64)
                        .sum();
                }
            }
        }
        out
    }

    // Tolerance for all tests here: |got - want| <= 1e-5 + 1e-5 |want|.
    const ATOL: f64 = 1e-5;
    const RTOL: f64 = 1e-5;

    #[test]
    fn attention_matches_reference() {
        let mut rng = Rng::new(61);
        let pools = [pool1(), pool2()];
        // (n_heads, n_kv_heads, head_dim): MHA, GQA, MQA, odd head dims,
        // and multiples of 64 (the AVX2 multi-head task).
        let heads = [
            (2, 2, 8),
            (4, 2, 7),
            (6, 3, 33),
            (3, 1, 16),
            (8, 1, 64),
            (9, 3, 64),
            (2, 1, 128),
        ];
        // (n_q, past): prefill, decode, chunked prefill.
        let steps = [(1, 0), (5, 0), (1, 9), (3, 4), (17, 20), (40, 0), (1, 40)];
        for pool in &pools {
            for &(n_heads, n_kv_heads, head_dim) in &heads {
                for &(n_q, past) in &steps {
                    for window in [None, Some(1), Some(3), Some(16), Some(1000)] {
                        let s = shape(n_heads, n_kv_heads, head_dim, window);
                        // Cache with 2 spare (garbage) rows beyond past + n_q.
                        let kv_len = past + n_q + 2;
                        let (q, k, v) = random_qkv(&mut rng, &s, n_q, kv_len);
                        let mut out = vec![f32::NAN; q.len()];
                        attention(&q, n_q, past, &k, &v, &s, &mut out, pool);
                        let want = reference(&q, n_q, past, &k, &v, &s);
                        assert_close(&out, &want, ATOL, RTOL);
                    }
                }
            }
        }
    }

    /// Runs the tiled kernel with `ops` (`parallel` in `pool`).
    #[allow(clippy::too_many_arguments)]
    fn run_tiled<O: tiled::TileOps>(
        ops: O,
        q: &[f32],
        n_q: usize,
        past: usize,
        k: &[f32],
        v: &[f32],
        s: &AttnShape,
        pool: &ThreadPool,
        parallel: bool,
    ) -> Vec<f32> {
        let mut out = vec![f32::NAN; q.len()];
        let row_len = s.n_kv_heads * s.head_dim;
        let (k, v) = (KvRows::f32(k, row_len), KvRows::f32(v, row_len));
        tiled::Tiled::new(q, n_q, past, k, v, s).run(ops, &mut out, pool, parallel);
        out
    }

    /// Checks the tiled kernel with `ops` against the f64 reference, serial
    /// and on two threads: 1 to 100 queries after a cached prefix, GQA
    /// (9 / 3 heads of 64), MHA, group sizes that do not divide a panel,
    /// head dims that are not a multiple of 4 or 8, sliding windows
    /// smaller and larger than a key block.
    fn check_tiled<O: tiled::TileOps>(ops: O) {
        let mut rng = Rng::new(64);
        let (p1, p2) = (pool1(), pool2());
        let heads = [(9, 3, 64), (4, 4, 16), (5, 1, 20), (6, 2, 7)];
        let steps = [(1, 3), (2, 0), (7, 5), (24, 1), (37, 70), (100, 13)];
        for &(n_heads, n_kv_heads, head_dim) in &heads {
            for &(n_q, past) in &steps {
                for window in [None, Some(1), Some(5), Some(90)] {
                    let s = shape(n_heads, n_kv_heads, head_dim, window);
                    let kv_len = past + n_q + 3;
                    let (q, k, v) = random_qkv(&mut rng, &s, n_q, kv_len);
                    let want = reference(&q, n_q, past, &k, &v, &s);
                    let serial = run_tiled(ops, &q, n_q, past, &k, &v, &s, &p1, false);
                    assert_close(&serial, &want, ATOL, RTOL);
                    let par = run_tiled(ops, &q, n_q, past, &k, &v, &s, &p2, true);
                    assert_close(&par, &want, ATOL, RTOL);
                }
            }
        }
    }

    #[test]
    fn tiled_scalar_matches_reference() {
        check_tiled(tiled::Scalar);
    }

    /// Runs `check` with each vector [`tiled::TileOps`] this CPU has (the
    /// AVX2 and the AVX-512 tiles), saying which it skips.
    #[cfg(target_arch = "x86_64")]
    fn each_vector_tile_ops(
        check_avx2: impl Fn(tiled::Avx2),
        check_avx512: impl Fn(tiled::Avx512),
    ) {
        match tiled::Avx2::detect() {
            Some(ops) => check_avx2(ops),
            None => eprintln!("skipping AVX2: no AVX2/FMA"),
        }
        match tiled::Avx512::detect() {
            Some(ops) => check_avx512(ops),
            None => eprintln!("skipping AVX-512: no AVX-512F"),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn tiled_vector_kernels_match_reference() {
        each_vector_tile_ops(check_tiled, check_tiled);
    }

    /// A capped call runs the capped level's kernels: a prefill capped at
    /// AVX2 gives the AVX2 tiles' bits, capped at scalar the portable
    /// tiles' bits, and a capped decode the reference's values.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_simd_cap_picks_the_kernels() {
        let Some(avx2) = tiled::Avx2::detect() else {
            eprintln!("skipping: no AVX2/FMA");
            return;
        };
        let mut rng = Rng::new(68);
        let s = SMOLLM2_SHAPE;
        let width = s.n_heads * s.head_dim;
        let row_len = s.n_kv_heads * s.head_dim;
        let (n_q, past) = (40, 30);
        let q = rng.vec(n_q * width, 2.0);
        let k = rng.vec((past + n_q) * row_len, 2.0);
        let v = rng.vec((past + n_q) * row_len, 1.0);
        let pool = pool2();
        let capped = |n_q: usize, past: usize, max: SimdLevel| {
            let seq = SeqAttention {
                q: &q[..n_q * width],
                n_q,
                past,
                k: KvRows::f32(&k, row_len),
                v: KvRows::f32(&v, row_len),
            };
            let mut out = vec![f32::NAN; n_q * width];
            attention_batch(&[seq], &s, vec![&mut out[..]], &pool, max);
            out
        };
        let tiled_at = |ops| run_tiled(ops, &q, n_q, past, &k, &v, &s, &pool, true);
        assert_eq!(
            bits(&capped(n_q, past, SimdLevel::Avx2)),
            bits(&tiled_at(avx2))
        );
        let scalar = run_tiled(tiled::Scalar, &q, n_q, past, &k, &v, &s, &pool, true);
        assert_eq!(bits(&capped(n_q, past, SimdLevel::Scalar)), bits(&scalar));
        let want = reference(&q[..width], 1, past + n_q - 1, &k, &v, &s);
        for max in [SimdLevel::Scalar, SimdLevel::Avx2] {
            assert_close(&capped(1, past + n_q - 1, max), &want, ATOL, RTOL);
        }
    }

    /// The AVX-512 kernel (panels of 32 rows, tiles of eight keys or head
    /// dimensions) gives the AVX2 one's bits (panels of 24 rows, tiles of
    /// three): head dims that fill whole tiles of both, of one, and of
    /// neither, row counts that fill neither kind of panel, with and
    /// without a window, serial and on two threads.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn tiled_avx512_equals_avx2_bit_for_bit() {
        let (Some(wide), Some(narrow)) = (tiled::Avx512::detect(), tiled::Avx2::detect()) else {
            eprintln!("skipping: no AVX-512F");
            return;
        };
        let mut rng = Rng::new(67);
        let (p1, p2) = (pool1(), pool2());
        for (n_heads, n_kv_heads, head_dim) in [(9, 3, 64), (4, 4, 24), (6, 2, 7), (2, 1, 40)] {
            for (n_q, past, window) in [(1, 0, None), (37, 70, None), (100, 13, Some(9))] {
                let s = shape(n_heads, n_kv_heads, head_dim, window);
                let kv_len = past + n_q;
                let (q, k, v) = random_qkv(&mut rng, &s, n_q, kv_len);
                for (pool, parallel) in [(&p1, false), (&p2, true)] {
                    let a = run_tiled(wide, &q, n_q, past, &k, &v, &s, pool, parallel);
                    let b = run_tiled(narrow, &q, n_q, past, &k, &v, &s, pool, parallel);
                    let what =
                        format!("heads {n_heads}/{n_kv_heads}x{head_dim}, {n_q} after {past}");
                    assert_eq!(
                        bits(&a),
                        bits(&b),
                        "{what}, window {window:?}, parallel {parallel}"
                    );
                }
            }
        }
    }

    /// Checks with `ops` that the tiled kernel gives each query the same bits
    /// however the prompt is cut into chunks: the queries `r..n` run as one
    /// chunk after `r` cached tokens equal rows `r..n` of the whole prompt,
    /// for cuts inside and at the edges of key blocks and panels, GQA and
    /// MHA, with and without a sliding window.
    fn check_tiled_chunking<O: tiled::TileOps>(ops: O) {
        let mut rng = Rng::new(66);
        let pool = pool1();
        let n = 150;
        for (n_heads, n_kv_heads, head_dim) in [(9, 3, 64), (4, 4, 16), (6, 2, 7)] {
            for window in [None, Some(5), Some(90)] {
                let s = shape(n_heads, n_kv_heads, head_dim, window);
                let width = n_heads * head_dim;
                let (q, k, v) = random_qkv(&mut rng, &s, n, n);
                let whole = run_tiled(ops, &q, n, 0, &k, &v, &s, &pool, false);
                for r in [1, 7, 30, 63, 64, 65, 100, 148] {
                    let part = run_tiled(ops, &q[r * width..], n - r, r, &k, &v, &s, &pool, false);
                    let same = part
                        .iter()
                        .zip(&whole[r * width..])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "cut at {r}, heads {n_heads}/{n_kv_heads}, window {window:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn tiled_scalar_results_do_not_depend_on_the_chunks() {
        check_tiled_chunking(tiled::Scalar);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn tiled_vector_results_do_not_depend_on_the_chunks() {
        each_vector_tile_ops(check_tiled_chunking, check_tiled_chunking);
    }

    /// SmolLM2-135M's attention: 9 query heads over 3 KV heads of 64.
    const SMOLLM2_SHAPE: AttnShape = AttnShape {
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
        scale: 0.125,
        sliding_window: None,
    };

    /// A long GQA prefill through [`attention`] (tiled, with key blocks
    /// cut by the causal diagonal): one and two threads agree with the
    /// reference and with each other.
    #[test]
    fn prefill_threads_agree() {
        let mut rng = Rng::new(65);
        let s = SMOLLM2_SHAPE;
        let (n_q, past) = (150, 20);
        let kv_len = past + n_q;
        let q = rng.vec(n_q * 9 * 64, 2.0);
        let k = rng.vec(kv_len * 3 * 64, 2.0);
        let v = rng.vec(kv_len * 3 * 64, 1.0);
        let want = reference(&q, n_q, past, &k, &v, &s);
        let mut one = vec![f32::NAN; q.len()];
        attention(&q, n_q, past, &k, &v, &s, &mut one, &pool1());
        assert_close(&one, &want, ATOL, RTOL);
        let mut two = vec![f32::NAN; q.len()];
        attention(&q, n_q, past, &k, &v, &s, &mut two, &pool2());
        let one64: Vec<f64> = one.iter().map(|&x| x as f64).collect();
        assert_close(&two, &one64, 1e-6, 1e-6);
    }

    #[test]
    fn incremental_equals_full_sequence() {
        let mut rng = Rng::new(62);
        let pool = pool2();
        for window in [None, Some(5)] {
            let s = AttnShape {
                n_heads: 6,
                n_kv_heads: 2,
                head_dim: 20,
                scale: 0.3,
                sliding_window: window,
            };
            let seq = 23;
            let width = s.n_heads * s.head_dim;
            let q = rng.vec(seq * width, 2.0);
            let k = rng.vec(seq * s.n_kv_heads * s.head_dim, 2.0);
            let v = rng.vec(seq * s.n_kv_heads * s.head_dim, 1.0);
            let mut full = vec![0.0f32; seq * width];
            attention(&q, seq, 0, &k, &v, &s, &mut full, &pool);
            // Chunked prefill (7 + 9) then decode one token at a time.
            let mut chunks = vec![(0, 7), (7, 9)];
            chunks.extend((16..seq).map(|p| (p, 1)));
            for (past, n_q) in chunks {
                let mut part = vec![f32::NAN; n_q * width];
                let qs = &q[past * width..(past + n_q) * width];
                attention(qs, n_q, past, &k, &v, &s, &mut part, &pool);
                let want: Vec<f64> = full[past * width..(past + n_q) * width]
                    .iter()
                    .map(|&x| x as f64)
                    .collect();
                // Same arithmetic per (query, head): |diff| <= 1e-6.
                assert_close(&part, &want, 1e-6, 0.0);
            }
        }
    }

    #[test]
    fn large_parallel_matches_reference() {
        let mut rng = Rng::new(63);
        let pool = pool2();
        let s = AttnShape {
            n_heads: 8,
            n_kv_heads: 2,
            head_dim: 64,
            scale: 0.125,
            sliding_window: Some(50),
        };
        let (n_q, past) = (30, 70);
        let kv_len = past + n_q;
        let q = rng.vec(n_q * 8 * 64, 2.0);
        let k = rng.vec(kv_len * 2 * 64, 2.0);
        let v = rng.vec(kv_len * 2 * 64, 1.0);
        let mut out = vec![f32::NAN; q.len()];
        attention(&q, n_q, past, &k, &v, &s, &mut out, &pool);
        assert_close(&out, &reference(&q, n_q, past, &k, &v, &s), ATOL, RTOL);
    }

    /// Decodes over more than `MIN_SPLIT_KEYS` visible keys (split into
    /// parts and combined) agree with the reference, give the same bits on one
    /// and two threads and inside a batch, and read encoded caches like f32
    /// caches of the decoded values.
    #[test]
    fn long_decodes_split_into_parts_match_the_reference() {
        use crate::cpu::kernels::kv_rows::{decode_portable, encode};
        use mllm_core::KvDtype;
        let mut rng = Rng::new(68);
        let row = 3 * 64;
        for (past, window) in [
            (40, None),
            (127, None),
            (200, Some(150)),
            (256, None),
            (700, Some(300)),
            (1024, None),
            (1500, None),
            (2600, Some(1100)),
            (3000, Some(900)),
        ] {
            let s = AttnShape {
                sliding_window: window,
                ..SMOLLM2_SHAPE
            };
            let kv_len = past + 1;
            let q = rng.vec(9 * 64, 2.0);
            let (k, v) = (rng.vec(kv_len * row, 2.0), rng.vec(kv_len * row, 1.0));
            let want = reference(&q, 1, past, &k, &v, &s);
            let mut one = vec![f32::NAN; q.len()];
            attention(&q, 1, past, &k, &v, &s, &mut one, &pool1());
            assert_close(&one, &want, ATOL, RTOL);
            let mut two = vec![f32::NAN; q.len()];
            attention(&q, 1, past, &k, &v, &s, &mut two, &pool2());
            assert_eq!(bits(&one), bits(&two), "past {past}");
            // In a batch with a short decode, each sequence serial.
            let short = rng.vec(11 * row, 1.0);
            let seqs = [
                SeqAttention {
                    q: &q,
                    n_q: 1,
                    past,
                    k: KvRows::f32(&k, row),
                    v: KvRows::f32(&v, row),
                },
                SeqAttention {
                    q: &q,
                    n_q: 1,
                    past: 10,
                    k: KvRows::f32(&short, row),
                    v: KvRows::f32(&short, row),
                },
            ];
            let mut outs = [vec![f32::NAN; q.len()], vec![f32::NAN; q.len()]];
            let [a, b] = &mut outs;
            attention_batch(&seqs, &s, vec![&mut a[..], &mut b[..]], &pool2(), FASTEST);
            assert_eq!(bits(&outs[0]), bits(&one), "past {past} in a batch");
            // Three long decodes together run one per thread, each serial.
            let three = [seqs[0], seqs[0], seqs[0]];
            let mut outs = [0, 1, 2].map(|_| vec![f32::NAN; q.len()]);
            let [a, b, c] = &mut outs;
            let views = vec![&mut a[..], &mut b[..], &mut c[..]];
            attention_batch(&three, &s, views, &pool2(), FASTEST);
            for o in &outs {
                assert_eq!(bits(o), bits(&one), "past {past}, three in a batch");
            }
            // A q8_0 cache equals an f32 cache of its decoded values.
            let kind = KvDtype::Q8_0;
            let (mut kb, mut vb) = (vec![0u8; kv_len * 204], vec![0u8; kv_len * 204]);
            encode(kind, &k, &mut kb);
            encode(kind, &v, &mut vb);
            let (mut kd, mut vd) = (vec![0f32; k.len()], vec![0f32; v.len()]);
            decode_portable(kind, &kb, &mut kd);
            decode_portable(kind, &vb, &mut vd);
            let mut plain = vec![f32::NAN; q.len()];
            attention(&q, 1, past, &kd, &vd, &s, &mut plain, &pool2());
            let seq = SeqAttention {
                q: &q,
                n_q: 1,
                past,
                k: KvRows::encoded(kind, &kb, row),
                v: KvRows::encoded(kind, &vb, row),
            };
            let mut got = vec![f32::NAN; q.len()];
            attention_batch(&[seq], &s, vec![&mut got[..]], &pool2(), FASTEST);
            assert_eq!(bits(&got), bits(&plain), "past {past} q8_0");
        }
    }

    /// Attention over a cache stored as f16, Q8_0 or Q4 gives, bit for
    /// bit, what it gives over an f32 cache holding the decoded values:
    /// decode steps and tiled prefill, with and without a sliding window,
    /// on one and two threads.
    #[test]
    fn encoded_caches_equal_f32_caches_of_their_decoded_values() {
        use crate::cpu::kernels::kv_rows::{decode_portable, encode};
        use mllm_core::KvDtype;
        let mut rng = Rng::new(67);
        let row = 3 * 64;
        for kind in [KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_1] {
            for (n_q, past) in [(1, 0), (1, 70), (1, 200), (3, 20), (40, 30), (150, 0)] {
                for window in [None, Some(50)] {
                    let s = AttnShape {
                        sliding_window: window,
                        ..SMOLLM2_SHAPE
                    };
                    let kv_len = past + n_q;
                    let q = rng.vec(n_q * 9 * 64, 2.0);
                    let (k, v) = (rng.vec(kv_len * row, 2.0), rng.vec(kv_len * row, 1.0));
                    let enc = |x: &[f32]| {
                        let mut b = vec![0u8; kv_len * kind.row_bytes(row)];
                        encode(kind, x, &mut b);
                        let mut back = vec![0f32; x.len()];
                        decode_portable(kind, &b, &mut back);
                        (b, back)
                    };
                    let ((kb, kd), (vb, vd)) = (enc(&k), enc(&v));
                    for pool in [pool1(), pool2()] {
                        let mut want = vec![f32::NAN; q.len()];
                        attention(&q, n_q, past, &kd, &vd, &s, &mut want, &pool);
                        let seq = SeqAttention {
                            q: &q,
                            n_q,
                            past,
                            k: KvRows::encoded(kind, &kb, row),
                            v: KvRows::encoded(kind, &vb, row),
                        };
                        let mut got = vec![f32::NAN; q.len()];
                        attention_batch(&[seq], &s, vec![&mut got[..]], &pool, FASTEST);
                        assert_eq!(bits(&got), bits(&want), "{kind} n_q {n_q} past {past}");
                    }
                }
            }
        }
    }

    /// A batch of sequences gives each exactly what `attention` gives it
    /// alone (split over the pool), both when the sequences run in
    /// parallel and when one prefill holds most of the work.
    #[test]
    fn batch_equals_each_sequence_alone() {
        let mut rng = Rng::new(66);
        let s = SMOLLM2_SHAPE;
        let width = 9 * 64;
        let pool = pool2();
        // Parallel decodes; a tiled chunk among long decodes (parallel);
        // one dominant prefill (one after another).
        for shape in [
            vec![(1, 40), (1, 7), (1, 90), (3, 12), (1, 0)],
            vec![(1, 300), (1, 300), (8, 40), (1, 300)],
            vec![(1, 5), (120, 30), (1, 60)],
        ] {
            let data: Vec<_> = shape
                .iter()
                .map(|&(n_q, past)| {
                    let kv = (past + n_q) * 3 * 64;
                    (
                        rng.vec(n_q * width, 2.0),
                        rng.vec(kv, 2.0),
                        rng.vec(kv, 1.0),
                    )
                })
                .collect();
            let seqs: Vec<SeqAttention<'_>> = shape
                .iter()
                .zip(&data)
                .map(|(&(n_q, past), (q, k, v))| SeqAttention {
                    q,
                    n_q,
                    past,
                    k: KvRows::f32(k, 3 * 64),
                    v: KvRows::f32(v, 3 * 64),
                })
                .collect();
            let mut outs: Vec<Vec<f32>> = shape
                .iter()
                .map(|&(n, _)| vec![f32::NAN; n * width])
                .collect();
            attention_batch(
                &seqs,
                &s,
                outs.iter_mut().map(|o| &mut o[..]).collect(),
                &pool,
                FASTEST,
            );
            for ((seq, got), (_, k, v)) in seqs.iter().zip(&outs).zip(&data) {
                let mut alone = vec![f32::NAN; got.len()];
                attention(seq.q, seq.n_q, seq.past, k, v, &s, &mut alone, &pool);
                assert_eq!(&alone, got, "{shape:?}: n_q {} past {}", seq.n_q, seq.past);
            }
        }
    }
}
