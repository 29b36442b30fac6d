//! The per-layer KV cache: per-sequence key and value rows, grown in
//! chunks, stored as the run's [`KvDtype`].

use std::any::Any;

use mllm_core::op::{KvCacheParams, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::{Error, KvDtype, Result, Shape};

use super::expect_rows;
use crate::cpu::kernels::kv_rows::{encode, KvRows};

/// `[capacity, row]` keys or values of one sequence.
enum RowStore {
    /// f32 rows, as computed.
    F32(Vec<f32>),
    /// Rows encoded as the cache's (non-f32) type.
    Encoded(Vec<u8>),
}

impl RowStore {
    fn new(kind: KvDtype) -> Self {
        match kind {
            KvDtype::F32 => RowStore::F32(Vec::new()),
            _ => RowStore::Encoded(Vec::new()),
        }
    }

    /// Rows the store has room for.
    fn capacity(&self, kind: KvDtype, row: usize) -> usize {
        match self {
            RowStore::F32(v) => v.len() / row,
            RowStore::Encoded(b) => b.len() / kind.row_bytes(row),
        }
    }

    /// Makes room for exactly `rows` rows.
    fn resize(&mut self, kind: KvDtype, row: usize, rows: usize) {
        match self {
            RowStore::F32(v) => v.resize(rows * row, 0.0),
            RowStore::Encoded(b) => b.resize(rows * kind.row_bytes(row), 0),
        }
    }

    /// Stores the rows `src` from row `at` on.
    fn write(&mut self, kind: KvDtype, row: usize, at: usize, src: &[f32]) {
        match self {
            RowStore::F32(v) => v[at * row..at * row + src.len()].copy_from_slice(src),
            RowStore::Encoded(b) => {
                let bytes = kind.row_bytes(row);
                let n = src.len() / row;
                encode(kind, src, &mut b[at * bytes..(at + n) * bytes]);
            }
        }
    }

    /// Makes the first `rows` rows those of `src` (same type and row
    /// length, at least `rows` rows; room for them already made).
    fn copy_rows(&mut self, kind: KvDtype, row: usize, src: &RowStore, rows: usize) {
        match (self, src) {
            (RowStore::F32(dst), RowStore::F32(src)) => {
                dst[..rows * row].copy_from_slice(&src[..rows * row])
            }
            (RowStore::Encoded(dst), RowStore::Encoded(src)) => {
                let n = rows * kind.row_bytes(row);
                dst[..n].copy_from_slice(&src[..n]);
            }
            _ => unreachable!("the stores of one cache share its type"),
        }
    }

    /// The first `rows` rows.
    fn view(&self, kind: KvDtype, row: usize, rows: usize) -> KvRows<'_> {
        match self {
            RowStore::F32(v) => KvRows::f32(&v[..rows * row], row),
            RowStore::Encoded(b) => KvRows::encoded(kind, &b[..rows * kind.row_bytes(row)], row),
        }
    }
}

/// Keys and values of one sequence, `[capacity, kv_heads * head_dim]` each.
struct SlotCache {
    keys: RowStore,
    values: RowStore,
    len: usize,
}

impl SlotCache {
    fn new(kind: KvDtype) -> Self {
        SlotCache {
            keys: RowStore::new(kind),
            values: RowStore::new(kind),
            len: 0,
        }
    }
}

/// The cache contents that attention reads.
pub struct KvCacheState {
    row: usize,
    kind: KvDtype,
    chunk: usize,
    slots: Vec<SlotCache>,
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
        match self.slots.get(slot) {
            Some(s) => s.keys.view(self.kind, self.row, s.len),
            None => KvRows::f32(&[], self.row),
        }
    }

    /// Values of `slot`: `len(slot)` rows.
    pub fn values(&self, slot: usize) -> KvRows<'_> {
        match self.slots.get(slot) {
            Some(s) => s.values.view(self.kind, self.row, s.len),
            None => KvRows::f32(&[], self.row),
        }
    }

    /// Positions reserved for `slot` (a multiple of the chunk size).
    pub fn capacity(&self, slot: usize) -> usize {
        self.slots
            .get(slot)
            .map_or(0, |s| s.keys.capacity(self.kind, self.row))
    }

    fn ensure_slot(&mut self, slot: usize) {
        if self.slots.len() <= slot {
            let kind = self.kind;
            self.slots.resize_with(slot + 1, || SlotCache::new(kind));
        }
    }

    /// Grows `slot` (in whole chunks) to hold at least `len` positions.
    fn reserve(&mut self, slot: usize, len: usize) {
        self.ensure_slot(slot);
        let (row, chunk, kind) = (self.row, self.chunk, self.kind);
        let s = &mut self.slots[slot];
        if len > s.keys.capacity(kind, row) {
            let grown = len.div_ceil(chunk) * chunk;
            s.keys.resize(kind, row, grown);
            s.values.resize(kind, row, grown);
        }
    }

    /// Makes slot `to` hold the first `len` positions of slot `from`.
    fn copy(&mut self, from: usize, to: usize, len: usize) {
        self.ensure_slot(from.max(to));
        let len = len.min(self.len(from));
        self.reserve(to, len);
        let (row, kind) = (self.row, self.kind);
        let mut dst = std::mem::replace(&mut self.slots[to], SlotCache::new(kind));
        let src = &self.slots[from];
        dst.keys.copy_rows(kind, row, &src.keys, len);
        dst.values.copy_rows(kind, row, &src.values, len);
        dst.len = len;
        self.slots[to] = dst;
    }

    fn write(&mut self, slot: usize, past: usize, k: &[f32], v: &[f32]) -> Result<()> {
        self.ensure_slot(slot);
        let (row, kind) = (self.row, self.kind);
        let s = &mut self.slots[slot];
        if past > s.len {
            return Err(Error::InvalidInput(format!(
                "KV cache slot {slot} holds {} positions; cannot write at position {past}",
                s.len
            )));
        }
        let new_len = past + k.len() / row;
        self.reserve(slot, new_len);
        let s = &mut self.slots[slot];
        s.keys.write(kind, row, past, k);
        s.values.write(kind, row, past, v);
        s.len = new_len;
        Ok(())
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

    /// Grows every slot of the step to its new length, on the caller's
    /// thread (`execute` then only copies).
    fn prepare(&mut self, step: &StepLayout) -> Result<()> {
        for seq in &step.seqs {
            self.state.reserve(seq.slot, seq.past + seq.len);
        }
        Ok(())
    }

    fn state(&self) -> Option<&dyn Any> {
        Some(&self.state)
    }

    fn reset_slot(&mut self, slot: usize) {
        if let Some(s) = self.state.slots.get_mut(slot) {
            *s = SlotCache::new(self.state.kind);
        }
    }

    fn copy_slot(&mut self, from: usize, to: usize, len: usize) {
        if from != to {
            self.state.copy(from, to, len);
        }
    }
}
