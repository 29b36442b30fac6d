//! A growable `f32` buffer whose values start on a cache line: the
//! executor's activation buffers. A kernel's 64-byte vector loads and
//! stores of a buffer's rows then touch one line each, where a buffer
//! aligned only as the allocator aligns (16 bytes) makes most of them
//! touch two.

use std::ops::{Deref, DerefMut};

/// Bytes of a cache line.
const LINE: usize = 64;

/// Values of one cache line.
const LINE_VALUES: usize = LINE / std::mem::size_of::<f32>();

/// `len` values from a cache line on, inside `storage`.
#[derive(Default)]
pub(crate) struct LineBuffer {
    storage: Vec<f32>,
    start: usize,
    len: usize,
}

impl LineBuffer {
    /// Grows the buffer to at least `len` values: the values it holds
    /// stay, the new ones are zero.
    pub(crate) fn grow_to(&mut self, len: usize) {
        if len <= self.len {
            return;
        }
        let storage = vec![0.0f32; len + LINE_VALUES - 1];
        let start = storage.as_ptr().align_offset(LINE);
        let start = if start < LINE_VALUES { start } else { 0 };
        let mut grown = LineBuffer {
            storage,
            start,
            len,
        };
        grown[..self.len].copy_from_slice(self);
        *self = grown;
    }
}

impl Deref for LineBuffer {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        &self.storage[self.start..self.start + self.len]
    }
}

impl DerefMut for LineBuffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_start_on_a_line_and_survive_growth() {
        let mut buffer = LineBuffer::default();
        assert!(buffer.is_empty());
        let mut want = Vec::new();
        for (step, len) in [3, 17, 16, 1000, 999, 4096, 5].into_iter().enumerate() {
            buffer.grow_to(len);
            want.resize(want.len().max(len), 0.0);
            assert_eq!(buffer.len(), want.len(), "step {step}");
            assert_eq!(buffer.as_ptr() as usize % LINE, 0, "step {step}");
            assert_eq!(&buffer[..], &want[..], "step {step}");
            for (i, (b, w)) in buffer.iter_mut().zip(&mut want).enumerate() {
                *b = (step * 10_000 + i) as f32;
                *w = *b;
            }
        }
    }
}
