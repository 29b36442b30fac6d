//! Tiled attention for prefill (many queries at once).
//!
//! The (query, head) pairs that share one kv head are the rows of a matrix;
//! [`TileOps::ROWS`] consecutive rows form a panel, processed against blocks of
//! [`KEYS`] keys with an online softmax (flash-attention style): per block,
//! the scores `S = Q·Kᵀ` and the update `O += P·V` are small register-blocked
//! matrix products, and the running row maxima and sums rescale `O` whenever
//! a maximum grows. Key blocks start at multiples of [`KEYS`]; blocks that
//! no row of a panel sees are never visited, and the causal /
//! sliding-window mask is applied only to blocks that need it.
//!
//! A row's result depends only on its query, its position and the keys,
//! never on the other rows of its panel: all arithmetic is lane-wise, a
//! masked key's probability is exactly 0, and a block of which a row sees
//! nothing rescales it by exactly 1. So a prompt cut into chunks at any
//! positions gives the same bits as the whole prompt at once.
//!
//! Panels are stored transposed (`[column][ROWS]`) so that one column of a
//! panel is a few whole vectors (three of 8 lanes with AVX2, two of 16 with
//! AVX-512): the softmax works on whole vectors without horizontal
//! reductions, and the products broadcast single key or value entries
//! against them. Panel heights differ between the kernels; since no row
//! depends on the others, their results do not.

use std::ops::Range;

use rayon::ThreadPool;

use super::AttnShape;
use crate::cpu::kernels::kv_rows::{KvRows, Tile};
use crate::cpu::kernels::task_queue::for_each_in_order;

/// Keys per online-softmax step.
const KEYS: usize = 64;

/// Where one head lives in rows of the KV cache.
#[derive(Clone, Copy)]
pub(super) struct KvLayout {
    /// Floats between consecutive cache rows.
    pub stride: usize,
    /// Offset of the head in a row.
    pub off: usize,
    /// Head dimension.
    pub dim: usize,
}

impl KvLayout {
    /// The layout of `tile`'s rows for heads of `dim`.
    fn of(tile: &Tile<'_>, dim: usize) -> Self {
        KvLayout {
            stride: tile.stride,
            off: tile.off,
            dim,
        }
    }

    /// The head's part of one cache row.
    #[inline]
    fn head(self, row: &[f32]) -> &[f32] {
        &row[self.off..][..self.dim]
    }
}

/// Running state of the rows of one panel (`ROWS` entries each).
pub(super) struct RowState {
    /// Running maximum score of each row (`-inf` before any visible key).
    pub max: Vec<f32>,
    /// Running sum of `exp(score - max)` of each row.
    pub sum: Vec<f32>,
    /// First visible key position of each row.
    pub lo: Vec<i32>,
    /// Last visible key position of each row.
    pub hi: Vec<i32>,
}

/// The three building blocks of a panel × key-block step. Implemented
/// portably ([`Scalar`]), on 256-bit vectors (`Avx2`) and on 512-bit ones
/// (`Avx512`).
pub(super) trait TileOps: Copy + Send + Sync {
    /// Rows (query, head pairs) per panel.
    const ROWS: usize;

    /// Scores of every key of `keys` (cache rows, `kv` layout) against the
    /// panel `qt` (`[dim][ROWS]`, pre-scaled): `st[j * ROWS + r] = q_r · k_j`.
    fn scores(self, qt: &[f32], keys: &[f32], kv: KvLayout, st: &mut [f32]);

    /// Online-softmax step over the first `nk` key columns of `st`: with
    /// `masked = Some(j0)` (the keys are at positions `j0..j0 + nk`), first
    /// sets the scores of keys outside each row's `lo..=hi` to `-inf`; then
    /// updates the running maxima and sums of `state`, rescales the
    /// accumulator `ot` (`[dim][ROWS]`) and turns the scores into
    /// unnormalized probabilities.
    fn softmax_step(
        self,
        st: &mut [f32],
        nk: usize,
        masked: Option<usize>,
        state: &mut RowState,
        ot: &mut [f32],
    );

    /// `ot[d * ROWS + r] += Σ_j st[j * ROWS + r] · v_j[d]` over the value
    /// rows of `values` (`kv` layout).
    fn accumulate(self, st: &[f32], values: &[f32], kv: KvLayout, ot: &mut [f32]);
}

/// Everything the tiled kernel reads (see [`super::attention`]).
pub(super) struct Tiled<'a> {
    q: &'a [f32],
    k: KvRows<'a>,
    v: KvRows<'a>,
    n_q: usize,
    past: usize,
    q_stride: usize,
    head_dim: usize,
    group: usize,
    n_kv_heads: usize,
    scale: f32,
    window: Option<usize>,
}

/// Per-thread buffers of one panel of `rows` rows.
struct Scratch {
    /// Scaled queries, `[dim][rows]`.
    qt: Vec<f32>,
    /// Scores, then probabilities, of one key block, `[KEYS][rows]`.
    st: Vec<f32>,
    /// Output accumulator, `[dim][rows]`.
    ot: Vec<f32>,
    /// One decoded block of keys, then of values (unused for an f32 cache).
    kv: Vec<f32>,
    /// The running state of the panel's rows.
    state: RowState,
}

impl Scratch {
    /// Buffers for panels of `rows` rows and heads of `dim`.
    fn new(rows: usize, dim: usize) -> Self {
        Scratch {
            qt: vec![0.0; dim * rows],
            st: vec![0.0; KEYS * rows],
            ot: vec![0.0; dim * rows],
            kv: Vec::new(),
            state: RowState {
                max: vec![0.0; rows],
                sum: vec![0.0; rows],
                lo: vec![0; rows],
                hi: vec![0; rows],
            },
        }
    }
}

impl<'a> Tiled<'a> {
    /// The kernel's view of the arguments of [`super::attention`].
    pub(super) fn new(
        q: &'a [f32],
        n_q: usize,
        past: usize,
        k: KvRows<'a>,
        v: KvRows<'a>,
        shape: &AttnShape,
    ) -> Self {
        Tiled {
            q,
            k,
            v,
            n_q,
            past,
            q_stride: shape.n_heads * shape.head_dim,
            head_dim: shape.head_dim,
            group: shape.n_heads / shape.n_kv_heads,
            n_kv_heads: shape.n_kv_heads,
            scale: shape.scale,
            window: shape.sliding_window.map(|w| w.max(1)),
        }
    }

    /// Queries per task: the smallest count whose rows fill whole panels
    /// of `rows` rows.
    fn block_queries(&self, rows: usize) -> usize {
        let (mut a, mut b) = (self.group, rows);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        rows / a
    }

    /// Runs the whole attention into `out` with `ops`, in `pool` when
    /// `parallel`. Tasks are (query block, kv head) pairs; each writes the
    /// parts of its query rows that belong to its heads. In the pool the
    /// threads take them from one queue, the last query blocks (the most
    /// keys) first.
    pub(super) fn run<O: TileOps>(
        &self,
        ops: O,
        out: &mut [f32],
        pool: &ThreadPool,
        parallel: bool,
    ) {
        let tasks = self.task_outputs(out, self.block_queries(O::ROWS));
        let task = |scratch: &mut Scratch, (t, mut rows): (usize, Vec<&mut [f32]>)| {
            self.task(
                ops,
                scratch,
                t / self.n_kv_heads,
                t % self.n_kv_heads,
                &mut rows,
            )
        };
        let new_scratch = || Scratch::new(O::ROWS, self.head_dim);
        if parallel {
            // Later query blocks see more keys: they go first, so that the
            // threads end together.
            let heaviest_first: Vec<_> = tasks.into_iter().enumerate().rev().collect();
            pool.install(|| {
                for_each_in_order(heaviest_first, new_scratch, |s, _, item| task(s, item))
            });
        } else {
            let mut scratch = new_scratch();
            for item in tasks.into_iter().enumerate() {
                task(&mut scratch, item);
            }
        }
    }

    /// The parts of `out` each task writes: for task `qb * n_kv_heads +
    /// kvh`, the `group * head_dim` values of kv head `kvh`'s query heads
    /// in each query row of block `qb` (blocks of `bq` queries).
    fn task_outputs<'o>(&self, out: &'o mut [f32], bq: usize) -> Vec<Vec<&'o mut [f32]>> {
        let n_tasks = self.n_q.div_ceil(bq) * self.n_kv_heads;
        let mut tasks: Vec<Vec<&mut [f32]>> =
            (0..n_tasks).map(|_| Vec::with_capacity(bq)).collect();
        let width = self.group * self.head_dim;
        for (i, row) in out.chunks_exact_mut(self.q_stride).enumerate() {
            for (kvh, part) in row.chunks_exact_mut(width).enumerate() {
                tasks[i / bq * self.n_kv_heads + kvh].push(part);
            }
        }
        tasks
    }

    /// Query block `qb`, kv head `kvh`, one panel of rows `(query, head)`
    /// at a time: `rows[i]` receives the heads of `kvh` of the block's
    /// `i`-th query (`[head][dim]`).
    fn task<O: TileOps>(
        &self,
        ops: O,
        s: &mut Scratch,
        qb: usize,
        kvh: usize,
        rows: &mut [&mut [f32]],
    ) {
        let first = qb * self.block_queries(O::ROWS) * self.group;
        let pairs = rows.len() * self.group;
        for p in (0..pairs).step_by(O::ROWS) {
            self.panel(ops, s, kvh, first, p..pairs.min(p + O::ROWS), rows);
        }
    }

    /// One panel: rows `first + panel` of kv head `kvh` (row `r` is query
    /// `r / group`, head `kvh * group + r % group`), written to the task's
    /// `rows` (row `first + p` to `rows[p / group]`, head `p % group`).
    fn panel<O: TileOps>(
        &self,
        ops: O,
        s: &mut Scratch,
        kvh: usize,
        first: usize,
        panel: Range<usize>,
        rows: &mut [&mut [f32]],
    ) {
        let dim = self.head_dim;
        let rows_per_panel = O::ROWS;
        let state = &mut s.state;
        self.pack_queries(&mut s.qt, state, kvh, first + panel.start, panel.len());
        let off = kvh * dim;
        s.ot.fill(0.0);
        // Rows are in query order: bounds grow with the row.
        let last = rows_per_panel - 1;
        let (lo_min, lo_max) = (state.lo[0] as usize, state.lo[last] as usize);
        let (hi_min, hi_max) = (state.hi[0] as usize, state.hi[last] as usize);
        // Key blocks start at multiples of `KEYS` whatever rows share the
        // panel, so each row sees the same blocks in any panel.
        let mut j0 = lo_min / KEYS * KEYS;
        while j0 <= hi_max {
            let j1 = (j0 + KEYS).min(hi_max + 1);
            let masked = (j0 < lo_max || j1 - 1 > hi_min).then_some(j0);
            let keys = self.k.head_tile(j0..j1, off, dim, &mut s.kv);
            ops.scores(&s.qt, keys.data, KvLayout::of(&keys, dim), &mut s.st);
            ops.softmax_step(&mut s.st, j1 - j0, masked, state, &mut s.ot);
            let values = self.v.head_tile(j0..j1, off, dim, &mut s.kv);
            let layout = KvLayout::of(&values, dim);
            let probs = &s.st[..(j1 - j0) * rows_per_panel];
            ops.accumulate(probs, values.data, layout, &mut s.ot);
            j0 = j1;
        }
        for (r, p) in panel.enumerate() {
            let orow = &mut rows[p / self.group][p % self.group * dim..][..dim];
            let inv = 1.0 / state.sum[r];
            for (x, col) in orow.iter_mut().zip(s.ot.chunks_exact(rows_per_panel)) {
                *x = col[r] * inv;
            }
        }
    }

    /// Packs the `n` query rows of a panel, scaled, into `qt` (`[dim][rows]`,
    /// zero beyond `n`) and sets `state` (`rows` rows) to their initial
    /// state. Padding rows copy the visible range of the last real row.
    fn pack_queries(
        &self,
        qt: &mut [f32],
        state: &mut RowState,
        kvh: usize,
        row0: usize,
        n: usize,
    ) {
        let dim = self.head_dim;
        let rows = state.max.len();
        qt.fill(0.0);
        state.max.fill(f32::NEG_INFINITY);
        state.sum.fill(0.0);
        for r in 0..rows {
            let row = row0 + r.min(n - 1);
            let (i, h) = (row / self.group, kvh * self.group + row % self.group);
            let p = self.past + i;
            state.hi[r] = i32::try_from(p).expect("positions fit i32");
            state.lo[r] = self.window.map_or(0, |w| (p + 1).saturating_sub(w)) as i32;
            if r < n {
                let qrow = &self.q[i * self.q_stride + h * dim..][..dim];
                for (col, &x) in qt.chunks_exact_mut(rows).zip(qrow) {
                    col[r] = x * self.scale;
                }
            }
        }
    }
}

/// Portable implementation of [`TileOps`] (loops over whole panel columns,
/// which compilers vectorize).
#[derive(Clone, Copy)]
pub(super) struct Scalar;

/// Rows per panel of [`Scalar`].
const SCALAR_ROWS: usize = 24;

impl TileOps for Scalar {
    const ROWS: usize = SCALAR_ROWS;

    fn scores(self, qt: &[f32], keys: &[f32], kv: KvLayout, st: &mut [f32]) {
        for (row, s) in keys
            .chunks_exact(kv.stride)
            .zip(st.chunks_exact_mut(SCALAR_ROWS))
        {
            s.fill(0.0);
            for (&kd, qc) in kv.head(row).iter().zip(qt.chunks_exact(SCALAR_ROWS)) {
                for (x, &qv) in s.iter_mut().zip(qc) {
                    *x += qv * kd;
                }
            }
        }
    }

    fn softmax_step(
        self,
        st: &mut [f32],
        nk: usize,
        masked: Option<usize>,
        state: &mut RowState,
        ot: &mut [f32],
    ) {
        let st = &mut st[..nk * SCALAR_ROWS];
        if let Some(j0) = masked {
            for (j, s) in st.chunks_exact_mut(SCALAR_ROWS).enumerate() {
                let pos = (j0 + j) as i32;
                for ((x, &lo), &hi) in s.iter_mut().zip(&state.lo).zip(&state.hi) {
                    if pos < lo || pos > hi {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
        }
        let mut base = [0.0f32; SCALAR_ROWS];
        let mut corr = [0.0f32; SCALAR_ROWS];
        for r in 0..SCALAR_ROWS {
            let block_max = st.iter().skip(r).step_by(SCALAR_ROWS).copied();
            let m = block_max.fold(state.max[r], f32::max);
            base[r] = if m == f32::NEG_INFINITY { 0.0 } else { m };
            corr[r] = (state.max[r] - base[r]).exp();
            state.max[r] = m;
            state.sum[r] *= corr[r];
        }
        for col in ot.chunks_exact_mut(SCALAR_ROWS) {
            for (x, &c) in col.iter_mut().zip(&corr) {
                *x *= c;
            }
        }
        for s in st.chunks_exact_mut(SCALAR_ROWS) {
            for ((x, &b), l) in s.iter_mut().zip(&base).zip(&mut state.sum) {
                *x = (*x - b).exp();
                *l += *x;
            }
        }
    }

    fn accumulate(self, st: &[f32], values: &[f32], kv: KvLayout, ot: &mut [f32]) {
        for (row, p) in values
            .chunks_exact(kv.stride)
            .zip(st.chunks_exact(SCALAR_ROWS))
        {
            for (&vd, oc) in kv.head(row).iter().zip(ot.chunks_exact_mut(SCALAR_ROWS)) {
                for (x, &pv) in oc.iter_mut().zip(p) {
                    *x += pv * vd;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use {avx2::Avx2, avx512::Avx512};

/// Defines module `$module` with `$name`, the [`TileOps`] on the vectors
/// of `lanes::$width` for CPUs with the `$detect` features, which its
/// functions enable as `$features`: panel columns of `$vectors` vectors,
/// micro-tiles of `$tile` keys or head dimensions. Every score and output
/// is the same sequence of lane-wise operations whatever the width, the
/// panel height and the tile, so every instance gives the same bits.
#[cfg(target_arch = "x86_64")]
macro_rules! vector_tile_ops {
    (
        $module:ident, $name:ident, $features:literal, $width:ident,
        $vectors:literal, $tile:literal, [$($detect:tt),+]
    ) => {
        mod $module {
            use super::super::lanes::$width::{self as lane, I, LANES, V};
            use crate::cpu::kernels::simd::inline_array::from_fn;
            use super::{KvLayout, RowState, TileOps};

            /// Vectors per panel column.
            const VECTORS: usize = $vectors;
            /// Rows per panel.
            const ROWS: usize = VECTORS * LANES;
            /// Keys (score columns) or head dimensions (output columns) per
            /// micro-tile: `TILE` × `VECTORS` accumulators plus the operands
            /// fit the registers.
            const TILE: usize = $tile;

            /// One panel column.
            type Col = [V; VECTORS];

            /// Proof that the CPU has the features this module's functions
            /// enable (only `detect` makes one).
            #[derive(Clone, Copy)]
            pub(in super::super) struct $name(());

            impl $name {
                /// `Some` when the CPU has the features.
                pub(in super::super) fn detect() -> Option<Self> {
                    let ok = true $(&& is_x86_feature_detected!($detect))+;
                    ok.then_some($name(()))
                }
            }

            impl TileOps for $name {
                const ROWS: usize = ROWS;

                fn scores(self, qt: &[f32], keys: &[f32], kv: KvLayout, st: &mut [f32]) {
                    // SAFETY: a value of this type exists only once `detect` found
                    // the features that the function enables.
                    unsafe { scores(qt, keys, kv, st) }
                }

                fn softmax_step(
                    self,
                    st: &mut [f32],
                    nk: usize,
                    masked: Option<usize>,
                    state: &mut RowState,
                    ot: &mut [f32],
                ) {
                    // SAFETY: a value of this type exists only once `detect` found
                    // the features that the function enables.
                    unsafe { softmax_step(st, nk, masked, state, ot) }
                }

                fn accumulate(self, st: &[f32], values: &[f32], kv: KvLayout, ot: &mut [f32]) {
                    // SAFETY: a value of this type exists only once `detect` found
                    // the features that the function enables.
                    unsafe { accumulate(st, values, kv, ot) }
                }
            }

            /// Loads one panel column (the first `ROWS` floats of `s`).
            #[target_feature(enable = $features)]
            #[inline]
            fn load(s: &[f32]) -> Col {
                let s = &s[..ROWS];
                from_fn(|v| lane::load(&s[v * LANES..]))
            }

            /// Stores one panel column into the first `ROWS` floats of `s`.
            #[target_feature(enable = $features)]
            #[inline]
            fn store(s: &mut [f32], c: Col) {
                let s = &mut s[..ROWS];
                for (part, x) in s.chunks_exact_mut(LANES).zip(c) {
                    lane::store(part, x);
                }
            }

            /// Loads one panel column of visible-range bounds.
            #[target_feature(enable = $features)]
            #[inline]
            fn load_i32(s: &[i32]) -> [I; VECTORS] {
                let s = &s[..ROWS];
                from_fn(|v| lane::load_i32(&s[v * LANES..]))
            }

            /// Scores of all keys, `TILE` at a time, then the remaining ones singly.
            #[target_feature(enable = $features)]
            fn scores(qt: &[f32], keys: &[f32], kv: KvLayout, st: &mut [f32]) {
                let qt = &qt[..kv.dim * ROWS];
                let tiles = keys.chunks_exact(TILE * kv.stride);
                let (rest, done) = (tiles.remainder(), tiles.len() * TILE);
                for (tile, s) in tiles.zip(st.chunks_exact_mut(TILE * ROWS)) {
                    let mut rows: [&[f32]; TILE] = [&[]; TILE];
                    for (n, row) in rows.iter_mut().enumerate() {
                        *row = kv.head(&tile[n * kv.stride..]);
                    }
                    score_tile(qt, rows, s);
                }
                let tail = st[done * ROWS..].chunks_exact_mut(ROWS);
                for (row, s) in rest.chunks_exact(kv.stride).zip(tail) {
                    score_tile(qt, [kv.head(row)], s);
                }
            }

            /// `N` score columns: `s[n * ROWS + r] = Σ_d qt[d][r] · keys[n][d]`.
            #[target_feature(enable = $features)]
            #[inline]
            fn score_tile<const N: usize>(qt: &[f32], keys: [&[f32]; N], s: &mut [f32]) {
                let mut acc = [[lane::zero(); VECTORS]; N];
                for (d, qc) in qt.chunks_exact(ROWS).enumerate() {
                    let q = load(qc);
                    for (a, key) in acc.iter_mut().zip(&keys) {
                        let kd = lane::splat(key[d]);
                        for (x, &qv) in a.iter_mut().zip(&q) {
                            *x = lane::fma(qv, kd, *x);
                        }
                    }
                }
                for (col, a) in s.chunks_exact_mut(ROWS).zip(acc) {
                    store(col, a);
                }
            }

            /// Vector form of [`TileOps::softmax_step`] (see there).
            #[target_feature(enable = $features)]
            fn softmax_step(
                st: &mut [f32],
                nk: usize,
                masked: Option<usize>,
                state: &mut RowState,
                ot: &mut [f32],
            ) {
                let st = &mut st[..nk * ROWS];
                if let Some(j0) = masked {
                    let (lo, hi) = (load_i32(&state.lo), load_i32(&state.hi));
                    for (j, s) in st.chunks_exact_mut(ROWS).enumerate() {
                        let pos = lane::splat_i32((j0 + j) as i32);
                        let mut c = load(s);
                        for v in 0..VECTORS {
                            c[v] = lane::hide_outside(c[v], pos, lo[v], hi[v]);
                        }
                        store(s, c);
                    }
                }
                let old = load(&state.max);
                let mut max = old;
                for s in st.chunks_exact(ROWS) {
                    let c = load(s);
                    for v in 0..VECTORS {
                        max[v] = lane::max(max[v], c[v]);
                    }
                }
                let mut base = max;
                let mut corr = max;
                for v in 0..VECTORS {
                    // Rows with no visible key yet subtract 0 (exp(-inf) is 0).
                    base[v] = lane::finite_or_zero(max[v]);
                    corr[v] = lane::exp(lane::sub(old[v], base[v]));
                }
                store(&mut state.max, max);
                for col in ot.chunks_exact_mut(ROWS) {
                    let mut c = load(col);
                    for v in 0..VECTORS {
                        c[v] = lane::mul(c[v], corr[v]);
                    }
                    store(col, c);
                }
                let mut sum = load(&state.sum);
                for v in 0..VECTORS {
                    sum[v] = lane::mul(sum[v], corr[v]);
                }
                for s in st.chunks_exact_mut(ROWS) {
                    let mut c = load(s);
                    for v in 0..VECTORS {
                        c[v] = lane::exp(lane::sub(c[v], base[v]));
                        sum[v] = lane::add(sum[v], c[v]);
                    }
                    store(s, c);
                }
                store(&mut state.sum, sum);
            }

            /// `ot += Pᵀ·V`, `TILE` head dimensions at a time, then the rest singly.
            #[target_feature(enable = $features)]
            fn accumulate(st: &[f32], values: &[f32], kv: KvLayout, ot: &mut [f32]) {
                let ot = &mut ot[..kv.dim * ROWS];
                let mut quads = ot.chunks_exact_mut(TILE * ROWS);
                for (t, o) in (&mut quads).enumerate() {
                    accumulate_tile::<TILE>(st, values, kv.stride, kv.off + t * TILE, o);
                }
                let done = kv.dim / TILE * TILE;
                for (t, o) in quads.into_remainder().chunks_exact_mut(ROWS).enumerate() {
                    accumulate_tile::<1>(st, values, kv.stride, kv.off + done + t, o);
                }
            }

            /// `N` output columns `col..col + N` of the head: `o[n][r] += Σ_j
            /// st[j][r] · v_j[col + n]`.
            #[target_feature(enable = $features)]
            #[inline]
            fn accumulate_tile<const N: usize>(
                st: &[f32],
                values: &[f32],
                stride: usize,
                col: usize,
                o: &mut [f32],
            ) {
                let mut acc = [[lane::zero(); VECTORS]; N];
                for (a, oc) in acc.iter_mut().zip(o.chunks_exact(ROWS)) {
                    *a = load(oc);
                }
                for (p, row) in st.chunks_exact(ROWS).zip(values.chunks_exact(stride)) {
                    let p = load(p);
                    let vals = &row[col..col + N];
                    for (a, &vd) in acc.iter_mut().zip(vals) {
                        let b = lane::splat(vd);
                        for (x, &pv) in a.iter_mut().zip(&p) {
                            *x = lane::fma(pv, b, *x);
                        }
                    }
                }
                for (oc, a) in o.chunks_exact_mut(ROWS).zip(acc) {
                    store(oc, a);
                }
            }
        }
    };
}

// AVX2 + FMA: 24-row panels, 3 × 3 accumulators, three query or
// probability vectors and a broadcast fill the 16 registers.
#[cfg(target_arch = "x86_64")]
vector_tile_ops!(avx2, Avx2, "avx2,fma", w256, 3, 3, ["avx2", "fma"]);

// AVX-512F: 32-row panels of two 16-lane vectors, 8 × 2 accumulators (of
// 32 registers).
#[cfg(target_arch = "x86_64")]
vector_tile_ops!(
    avx512,
    Avx512,
    "avx2,fma,avx512f",
    w512,
    2,
    8,
    ["avx2", "fma", "avx512f"]
);
