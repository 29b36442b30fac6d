//! A growable buffer whose values start on a cache line: the executor's
//! activation buffers and the CPU kernels' quantized activation planes. A
//! kernel's 64-byte vector loads and stores (and an AMX tile load's
//! 64-byte rows) then touch one line each, where a buffer aligned only as
//! the allocator aligns (16 bytes) makes most of them touch two.

use std::ops::{Deref, DerefMut};

/// Bytes of a cache line.
pub const LINE: usize = 64;

/// `len` values from a cache line on, inside `storage`.
#[derive(Default)]
pub struct LineBuffer<T> {
    storage: Vec<T>,
    start: usize,
    len: usize,
}

impl<T: Copy + Default> LineBuffer<T> {
    /// Grows the buffer to at least `len` values: the values it holds
    /// stay, the new ones are `T::default()`.
    pub fn grow_to(&mut self, len: usize) {
        if len <= self.len {
            return;
        }
        let line_values = LINE.div_ceil(std::mem::size_of::<T>().max(1));
        let storage = vec![T::default(); len + line_values - 1];
        let start = storage.as_ptr().align_offset(LINE);
        let start = if start < line_values { start } else { 0 };
        let mut grown = LineBuffer {
            storage,
            start,
            len,
        };
        grown[..self.len].copy_from_slice(self);
        *self = grown;
    }
}

impl<T> Deref for LineBuffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.storage[self.start..self.start + self.len]
    }
}

impl<T> DerefMut for LineBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grows a buffer through `lens`, checking at each step that it starts
    /// on a line, is as long as the longest so far, and kept its values.
    fn check_growth<T: Copy + Default + PartialEq + std::fmt::Debug>(
        lens: &[usize],
        value: impl Fn(usize) -> T,
    ) {
        let mut buffer = LineBuffer::<T>::default();
        assert!(buffer.is_empty());
        let mut want = Vec::new();
        for (step, &len) in lens.iter().enumerate() {
            buffer.grow_to(len);
            want.resize(want.len().max(len), T::default());
            assert_eq!(buffer.len(), want.len(), "step {step}");
            assert_eq!(buffer.as_ptr() as usize % LINE, 0, "step {step}");
            assert_eq!(&buffer[..], &want[..], "step {step}");
            for (i, (b, w)) in buffer.iter_mut().zip(&mut want).enumerate() {
                *b = value(step * 10_000 + i);
                *w = *b;
            }
        }
    }

    #[test]
    fn values_start_on_a_line_and_survive_growth() {
        let lens = [3, 17, 16, 1000, 999, 4096, 5, 5000, 70_000];
        check_growth::<f32>(&lens, |i| i as f32);
        check_growth::<i8>(&lens, |i| (i % 251) as i8);
    }
}
