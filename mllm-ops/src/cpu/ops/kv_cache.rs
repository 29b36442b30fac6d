//! The per-layer KV cache: per-sequence key and value rows, grown in chunks.

use std::any::Any;

use mllm_core::op::{KvCacheParams, Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::{Error, Result, Shape};

use super::expect_rows;

/// Keys and values of one sequence, `[capacity, kv_heads * head_dim]` each.
#[derive(Default)]
struct SlotCache {
    keys: Vec<f32>,
    values: Vec<f32>,
    len: usize,
}

/// The cache contents that attention reads.
pub struct KvCacheState {
    row: usize,
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

    /// Keys of `slot`: `len(slot)` rows.
    pub fn keys(&self, slot: usize) -> &[f32] {
        self.slots
            .get(slot)
            .map_or(&[], |s| &s.keys[..s.len * self.row])
    }

    /// Values of `slot`: `len(slot)` rows.
    pub fn values(&self, slot: usize) -> &[f32] {
        self.slots
            .get(slot)
            .map_or(&[], |s| &s.values[..s.len * self.row])
    }

    /// Positions reserved for `slot` (a multiple of the chunk size).
    pub fn capacity(&self, slot: usize) -> usize {
        self.slots.get(slot).map_or(0, |s| s.keys.len() / self.row)
    }

    /// Grows `slot` (in whole chunks) to hold at least `len` positions.
    fn reserve(&mut self, slot: usize, len: usize) {
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, SlotCache::default);
        }
        let (row, chunk) = (self.row, self.chunk);
        let s = &mut self.slots[slot];
        if len > s.keys.len() / row {
            let grown = len.div_ceil(chunk) * chunk;
            s.keys.resize(grown * row, 0.0);
            s.values.resize(grown * row, 0.0);
        }
    }

    fn write(&mut self, slot: usize, past: usize, k: &[f32], v: &[f32]) -> Result<()> {
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, SlotCache::default);
        }
        let row = self.row;
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
        s.keys[past * row..new_len * row].copy_from_slice(k);
        s.values[past * row..new_len * row].copy_from_slice(v);
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
    /// An empty cache.
    pub fn new(params: KvCacheParams) -> Result<Self> {
        if params.chunk == 0 {
            return Err(Error::Config("KV cache chunk must be positive".into()));
        }
        Ok(KvCacheOp {
            state: KvCacheState {
                row: params.n_kv_heads * params.head_dim,
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
            *s = SlotCache::default();
        }
    }
}
