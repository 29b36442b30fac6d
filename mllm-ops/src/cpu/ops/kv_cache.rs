//! The per-layer KV cache: per-sequence key and value rows in pages of
//! `chunk` positions, stored as the run's [`KvDtype`].
//!
//! Pages are reference-counted: [`Op::copy_slot`] makes a slot share the
//! pages of another's prefix instead of copying them, and a page is copied
//! only when a slot writes into a page it shares (copy on write). So a
//! sequence forked from another (a beam, a request continuing a running
//! one's prompt) costs at most one page per layer, whatever its length.

use std::any::Any;
use std::sync::Arc;

use mllm_core::op::{KvCacheParams, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::{Error, KvDtype, Result, Shape};

use super::expect_rows;
use crate::cpu::kernels::kv_rows::{encode, KvPage, KvRows};

/// Keys or values of one sequence: pages of `chunk` rows.
type Pages = Vec<Arc<KvPage>>;

/// Keys and values of one sequence and how many positions they hold.
#[derive(Default)]
struct SlotCache {
    keys: Pages,
    values: Pages,
    len: usize,
}

/// The cache contents that attention reads.
pub struct KvCacheState {
    row: usize,
    kind: KvDtype,
    chunk: usize,
    slots: Vec<SlotCache>,
    /// Pages of reset slots that no other slot shares, kept for the next
    /// sequence: taking one costs no allocation and no page faults, and
    /// the cache's memory stays at its high-water mark.
    spare: Pages,
}

impl KvCacheState {
    /// Floats per cached position (`kv_heads * head_dim`).
    pub fn row_len(&self) -> usize {
        self.row
    }

    /// Positions cached for `slot`.
    pub fn len(&self, slot: usize) -> usize {
        self.slots.get(slot).map_or(0, |s| s.len)
    }

    /// True when no slot holds anything.
    pub fn is_empty(&self) -> bool {
        self.slots.iter().all(|s| s.len == 0)
    }

    /// The storage type of the rows.
    pub fn kind(&self) -> KvDtype {
        self.kind
    }

    /// Keys of `slot`: `len(slot)` rows.
    pub fn keys(&self, slot: usize) -> KvRows<'_> {
        self.rows(slot, |s| &s.keys)
    }

    /// Values of `slot`: `len(slot)` rows.
    pub fn values(&self, slot: usize) -> KvRows<'_> {
        self.rows(slot, |s| &s.values)
    }

    fn rows(&self, slot: usize, which: impl Fn(&SlotCache) -> &Pages) -> KvRows<'_> {
        match self.slots.get(slot) {
            Some(s) => KvRows::paged(self.kind, which(s), self.chunk, s.len, self.row),
            None => KvRows::f32(&[], self.row),
        }
    }

    /// Positions reserved for `slot` (a multiple of the chunk size).
    pub fn capacity(&self, slot: usize) -> usize {
        self.slots
            .get(slot)
            .map_or(0, |s| s.keys.len() * self.chunk)
    }

    fn ensure_slot(&mut self, slot: usize) {
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, SlotCache::default);
        }
    }

    /// A page to fill: a spare one (holding stale rows, which no slot
    /// reads before writing them) or a new zeroed one.
    fn new_page(&mut self) -> Arc<KvPage> {
        self.spare.pop().unwrap_or_else(|| {
            Arc::new(match self.kind {
                KvDtype::F32 => KvPage::F32(vec![0.0; self.chunk * self.row]),
                kind => KvPage::Encoded(vec![0; self.chunk * kind.row_bytes(self.row)]),
            })
        })
    }

    /// Drops the pages of a slot's old contents, keeping those no other
    /// slot shares as spares.
    fn release(&mut self, old: SlotCache) {
        let unshared = |p: &Arc<KvPage>| Arc::strong_count(p) == 1;
        self.spare
            .extend(old.keys.into_iter().chain(old.values).filter(unshared));
    }

    /// Makes `slot` able to take positions `from..to`: grows it in whole
    /// pages and gives it its own copy of every page in that range that it
    /// shares with another slot.
    fn reserve(&mut self, slot: usize, from: usize, to: usize) {
        self.ensure_slot(slot);
        while self.slots[slot].keys.len() * self.chunk < to {
            let (k, v) = (self.new_page(), self.new_page());
            let s = &mut self.slots[slot];
            s.keys.push(k);
            s.values.push(v);
        }
        let s = &mut self.slots[slot];
        for p in from / self.chunk..to.div_ceil(self.chunk) {
            Arc::make_mut(&mut s.keys[p]);
            Arc::make_mut(&mut s.values[p]);
        }
    }

    /// Makes slot `to` hold the first `len` positions of slot `from`,
    /// sharing its pages.
    fn copy(&mut self, from: usize, to: usize, len: usize) {
        self.ensure_slot(from.max(to));
        let len = len.min(self.len(from));
        let pages = len.div_ceil(self.chunk);
        let src = &self.slots[from];
        let copied = SlotCache {
            keys: src.keys[..pages].to_vec(),
            values: src.values[..pages].to_vec(),
            len,
        };
        let old = std::mem::replace(&mut self.slots[to], copied);
        self.release(old);
    }

    fn write(&mut self, slot: usize, past: usize, k: &[f32], v: &[f32]) -> Result<()> {
        self.ensure_slot(slot);
        let held = self.slots[slot].len;
        if past > held {
            return Err(Error::InvalidInput(format!(
                "KV cache slot {slot} holds {held} positions; cannot write at position {past}"
            )));
        }
        let new_len = past + k.len() / self.row;
        self.reserve(slot, past, new_len);
        let (row, kind, chunk) = (self.row, self.kind, self.chunk);
        let s = &mut self.slots[slot];
        let mut at = past;
        while at < new_len {
            let (p, local) = (at / chunk, at % chunk);
            let end = new_len.min((p + 1) * chunk);
            let src = (at - past) * row..(end - past) * row;
            write_rows(
                Arc::make_mut(&mut s.keys[p]),
                kind,
                row,
                local,
                &k[src.clone()],
            );
            write_rows(Arc::make_mut(&mut s.values[p]), kind, row, local, &v[src]);
            at = end;
        }
        s.len = new_len;
        Ok(())
    }
}

/// Stores the rows `src` into `page` from row `at` on.
fn write_rows(page: &mut KvPage, kind: KvDtype, row: usize, at: usize, src: &[f32]) {
    match page {
        KvPage::F32(v) => v[at * row..at * row + src.len()].copy_from_slice(src),
        KvPage::Encoded(b) => {
            let bytes = kind.row_bytes(row);
            let n = src.len() / row;
            encode(kind, src, &mut b[at * bytes..(at + n) * bytes]);
        }
    }
}

/// The CPU KV-cache op: appends the step's keys and values, exposes the state.
pub struct KvCacheOp {
    params: KvCacheParams,
    state: KvCacheState,
}

impl KvCacheOp {
    /// An empty cache storing its rows as `kind` (whose blocks must divide
    /// the head dimension).
    pub fn new(params: KvCacheParams, kind: KvDtype) -> Result<Self> {
        if params.chunk == 0 {
            return Err(Error::Config("KV cache chunk must be positive".into()));
        }
        kind.check_head_dim(params.head_dim)?;
        Ok(KvCacheOp {
            state: KvCacheState {
                row: params.n_kv_heads * params.head_dim,
                kind,
                chunk: params.chunk,
                slots: Vec::new(),
                spare: Vec::new(),
            },
            params,
        })
    }
}

impl Op for KvCacheOp {
    fn reshape(&mut self, inputs: &[&Shape], _step: &StepLayout) -> Result<Shape> {
        let row = self.params.n_kv_heads * self.params.head_dim;
        let k = expect_rows("kv_cache", "keys", inputs[0], row)?;
        let v = expect_rows("kv_cache", "values", inputs[1], row)?;
        if k != v {
            return Err(Error::shape(
                "kv_cache",
                format!("{k} key rows but {v} value rows"),
            ));
        }
        Ok(Shape::default())
    }

    fn execute(
        &mut self,
        inputs: &[OpInput<'_>],
        _output: &mut [f32],
        step: &StepLayout,
    ) -> Result<()> {
        let k = inputs[0].tensor("kv_cache")?.data;
        let v = inputs[1].tensor("kv_cache")?.data;
        let row = self.state.row;
        for seq in &step.seqs {
            let range = seq.start * row..(seq.start + seq.len) * row;
            self.state
                .write(seq.slot, seq.past, &k[range.clone()], &v[range])?;
        }
        Ok(())
    }

    /// Grows every slot of the step to its new length and gives it its own
    /// copy of any shared page it is about to write, on the caller's thread
    /// (`execute` then only writes rows).
    fn prepare(&mut self, step: &StepLayout) -> Result<()> {
        for seq in &step.seqs {
            self.state.reserve(seq.slot, seq.past, seq.past + seq.len);
        }
        Ok(())
    }

    fn state(&self) -> Option<&dyn Any> {
        Some(&self.state)
    }

    fn reset_slot(&mut self, slot: usize) {
        if let Some(s) = self.state.slots.get_mut(slot) {
            let old = std::mem::take(s);
            self.state.release(old);
        }
    }

    fn copy_slot(&mut self, from: usize, to: usize, len: usize) {
        if from != to {
            self.state.copy(from, to, len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `slot` that another slot shares too (keys and values
    /// counted once).
    fn shared_pages(c: &KvCacheState, slot: usize) -> usize {
        c.slots.get(slot).map_or(0, |s| {
            s.keys.iter().filter(|p| Arc::strong_count(p) > 1).count()
        })
    }

    /// The op of a cache of rows of 32 values in pages of 4 positions.
    fn cache_op(kind: KvDtype) -> KvCacheOp {
        KvCacheOp::new(
            KvCacheParams {
                n_kv_heads: 1,
                head_dim: 32,
                chunk: 4,
            },
            kind,
        )
        .unwrap()
    }

    /// A cache of rows of 32 values in pages of 4 positions.
    fn cache(kind: KvDtype) -> KvCacheState {
        cache_op(kind).state
    }

    /// `n` rows whose values identify the row and the writer.
    fn rows(first: usize, n: usize, tag: f32) -> Vec<f32> {
        (0..n * 32)
            .map(|i| tag + (first * 32 + i) as f32 / 64.0)
            .collect()
    }

    /// All of a slot's keys and values, decoded.
    fn contents(c: &KvCacheState, slot: usize) -> (Vec<f32>, Vec<f32>) {
        let read = |kv: KvRows<'_>| {
            let mut buf = Vec::new();
            kv.head_tile(0..kv.rows(), 0, 32, &mut buf).data.to_vec()
        };
        (read(c.keys(slot)), read(c.values(slot)))
    }

    #[test]
    fn a_copied_slot_shares_pages_until_either_slot_writes_into_one() {
        for kind in [KvDtype::F32, KvDtype::Q8_0] {
            let mut c = cache(kind);
            c.write(0, 0, &rows(0, 10, 1.0), &rows(0, 10, -1.0))
                .unwrap();
            c.copy(0, 1, 6);
            assert_eq!((c.len(1), shared_pages(&c, 1)), (6, 2), "{kind}");
            let (k0, v0) = contents(&c, 0);
            let (k1, v1) = contents(&c, 1);
            assert_eq!((&k1[..], &v1[..]), (&k0[..6 * 32], &v0[..6 * 32]));

            // Slot 1 writes position 6, in the second page: it gets its own
            // copy of that page only, and slot 0 keeps its row 6.
            c.reserve(1, 6, 7);
            assert_eq!(shared_pages(&c, 1), 1, "{kind}");
            c.write(1, 6, &rows(6, 1, 5.0), &rows(6, 1, -5.0)).unwrap();
            assert_eq!(contents(&c, 0), (k0.clone(), v0.clone()), "{kind}");
            let (k1, _) = contents(&c, 1);
            assert_eq!(&k1[..6 * 32], &k0[..6 * 32]);
            assert_ne!(&k1[6 * 32..], &k0[6 * 32..7 * 32]);

            // Writing into the shared first page from slot 0 leaves slot 1's.
            c.write(0, 2, &rows(2, 1, 9.0), &rows(2, 1, -9.0)).unwrap();
            assert_eq!(contents(&c, 1).0[..6 * 32], k1[..6 * 32], "{kind}");
            assert_eq!(shared_pages(&c, 1), 0, "{kind}");
        }
    }

    #[test]
    fn a_reset_slot_releases_its_share_of_the_pages() {
        let mut c = cache(KvDtype::F32);
        c.write(0, 0, &rows(0, 5, 1.0), &rows(0, 5, 2.0)).unwrap();
        c.copy(0, 1, 5);
        assert_eq!(shared_pages(&c, 0), 2);
        c.slots[1] = SlotCache::default();
        assert_eq!(shared_pages(&c, 0), 0);
    }

    /// Resetting a slot keeps the pages no other slot shares, and the next
    /// sequence fills those instead of new ones, reading back only what it
    /// wrote; the slot that shared the rest keeps its rows.
    #[test]
    fn a_reset_slot_leaves_its_own_pages_to_the_next_sequence() {
        for kind in [KvDtype::F32, KvDtype::Q8_0] {
            let mut op = cache_op(kind);
            op.state
                .write(0, 0, &rows(0, 10, 1.0), &rows(0, 10, -1.0))
                .unwrap();
            op.copy_slot(0, 1, 6);
            let shared = contents(&op.state, 1);
            let own: Vec<*const KvPage> =
                [&op.state.slots[0].keys[2], &op.state.slots[0].values[2]]
                    .map(Arc::as_ptr)
                    .to_vec();
            op.reset_slot(0);
            assert_eq!(
                op.state.spare.len(),
                2,
                "{kind}: the unshared key and value pages"
            );

            op.state
                .write(2, 0, &rows(0, 3, 7.0), &rows(0, 3, -7.0))
                .unwrap();
            assert!(op.state.spare.is_empty(), "{kind}");
            let reused =
                [&op.state.slots[2].keys[0], &op.state.slots[2].values[0]].map(Arc::as_ptr);
            assert!(
                reused.iter().all(|p| own.contains(p)),
                "{kind}: spare pages taken"
            );
            let mut fresh = cache(kind);
            fresh
                .write(0, 0, &rows(0, 3, 7.0), &rows(0, 3, -7.0))
                .unwrap();
            assert_eq!(contents(&op.state, 2), contents(&fresh, 0), "{kind}");
            assert_eq!(contents(&op.state, 1), shared, "{kind}");
        }
    }

    #[test]
    fn writing_past_the_end_of_a_slot_is_an_error() {
        let mut c = cache(KvDtype::F32);
        c.write(0, 0, &rows(0, 2, 1.0), &rows(0, 2, 1.0)).unwrap();
        let err = c.write(0, 3, &rows(3, 1, 1.0), &rows(3, 1, 1.0));
        assert_eq!(
            err.unwrap_err().to_string(),
            "invalid input: KV cache slot 0 holds 2 positions; cannot write at position 3"
        );
    }
}
