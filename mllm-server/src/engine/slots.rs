//! The KV-cache slots of the engine: which are busy, and what the free
//! ones still hold, so that a new prompt that starts like an earlier one
//! (the next turn of a chat, a shared system prompt) prefills only the rest.

use std::cmp::Reverse;

/// One KV-cache slot.
#[derive(Clone, Debug, Default)]
struct Slot {
    busy: bool,
    /// Tokens whose keys and values the slot holds, from position 0.
    tokens: Vec<u32>,
    /// How many leading tokens were computed in whole prefill chunks (a
    /// multiple of the chunk length): only these are reused, since a new
    /// prompt computes those positions in the very same chunks.
    reusable: usize,
    /// When the slot was last released (larger is later).
    released_at: u64,
}

/// A slot handed to a new sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquired {
    /// The slot index.
    pub slot: usize,
    /// Leading prompt tokens whose cache entries the slot already holds.
    pub reused: usize,
}

/// The table of slots.
pub struct Slots {
    slots: Vec<Slot>,
    chunk: usize,
    clock: u64,
}

impl Slots {
    /// `n` empty slots; prefills run in chunks of `chunk` tokens.
    pub fn new(n: usize, chunk: usize) -> Self {
        Slots {
            slots: vec![Slot::default(); n],
            chunk,
            clock: 0,
        }
    }

    /// Takes the free slot that shares the longest reusable prefix with
    /// `prompt` (among equals the least recently released, then the lowest), or `None`
    /// when every slot is busy. At least one prompt token is always left to
    /// prefill, so that the step yields the logits of the last one.
    pub fn acquire(&mut self, prompt: &[u32]) -> Option<Acquired> {
        let limit = prompt.len().saturating_sub(1) / self.chunk * self.chunk;
        let (slot, reused) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.busy)
            .map(|(i, s)| {
                let common = s
                    .tokens
                    .iter()
                    .zip(prompt)
                    .take_while(|(a, b)| a == b)
                    .count();
                let reused = (common / self.chunk * self.chunk)
                    .min(s.reusable)
                    .min(limit);
                (i, reused)
            })
            .max_by_key(|&(i, reused)| {
                let s = &self.slots[i];
                (reused, Reverse(s.released_at), Reverse(i))
            })?;
        let s = &mut self.slots[slot];
        s.busy = true;
        s.tokens.truncate(reused);
        s.reusable = reused;
        Some(Acquired { slot, reused })
    }

    /// Frees `slot`, which now holds `tokens`, of which the first
    /// `reusable` were computed in whole prefill chunks.
    pub fn release(&mut self, slot: usize, tokens: Vec<u32>, reusable: usize) {
        self.clock += 1;
        self.slots[slot] = Slot {
            busy: false,
            reusable: reusable.min(tokens.len()),
            tokens,
            released_at: self.clock,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_is_limited_to_whole_chunks_and_leaves_a_token_to_prefill() {
        let mut slots = Slots::new(2, 4);
        let first: Vec<u32> = (0..11).collect();
        let a = slots.acquire(&first).unwrap();
        assert_eq!(a, Acquired { slot: 0, reused: 0 });
        // Prompt of 11 in chunks of 4: positions 0..8 were whole chunks;
        // three generated tokens were fed after it.
        let mut held = first.clone();
        held.extend([100, 101, 102]);
        slots.release(0, held, 8);
        // The next turn starts with everything held, but only 8 are reusable.
        let mut next: Vec<u32> = (0..11).collect();
        next.extend([100, 101, 102, 7, 7]);
        assert_eq!(slots.acquire(&next), Some(Acquired { slot: 0, reused: 8 }));
        slots.release(0, next.clone(), 16);
        // The very same 16-token prompt again: reuse 12, prefill the last 4.
        assert_eq!(
            slots.acquire(&next),
            Some(Acquired {
                slot: 0,
                reused: 12
            })
        );
    }

    #[test]
    fn picks_the_best_prefix_else_the_least_recently_released_slot() {
        let mut slots = Slots::new(3, 2);
        for s in 0..3 {
            assert_eq!(slots.acquire(&[9, 9, 9]).unwrap().slot, s);
        }
        assert_eq!(slots.acquire(&[1]), None);
        slots.release(1, vec![1, 2, 3, 4, 5], 4);
        slots.release(0, vec![7, 7, 7], 2);
        slots.release(2, vec![1, 2, 8, 8], 4);
        // Shares 4 with slot 1, 2 with slot 2.
        assert_eq!(
            slots.acquire(&[1, 2, 3, 4, 6]),
            Some(Acquired { slot: 1, reused: 4 })
        );
        // Nothing shared: slot 0 was released before slot 2.
        assert_eq!(
            slots.acquire(&[5, 5, 5]),
            Some(Acquired { slot: 0, reused: 0 })
        );
        assert_eq!(
            slots.acquire(&[5, 5, 5]),
            Some(Acquired { slot: 2, reused: 0 })
        );
    }
}
