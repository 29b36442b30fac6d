//! The KV-cache slots of the engine: which are busy, and what the free
//! ones still hold, so that a new prompt that starts like an earlier one
//! (the next turn of a chat, a shared system prompt) prefills only the rest.
//!
//! Reuse is exact: a reused position holds the very bits the new prompt
//! would compute for it alone. Attention runs a chunk of several tokens
//! through a kernel whose result for a position does not depend on where
//! the chunk starts or ends, and a single token through another one. When
//! a prompt runs alone in chunks of `chunk >= 2` tokens, every position but
//! possibly the last is computed in a chunk of several tokens. So a cached
//! position may be reused when it was computed in a chunk of the same kind
//! ([`reusable_chunk`]), and the rest of a prompt after a reused prefix must
//! not start with a lone token where the prompt alone would have more.

use std::cmp::Reverse;

/// One KV-cache slot.
#[derive(Clone, Debug, Default)]
struct Slot {
    busy: bool,
    /// Tokens whose keys and values the slot holds, from position 0.
    tokens: Vec<u32>,
    /// How many leading tokens were computed in chunks that
    /// [`reusable_chunk`] accepts: only these are reused.
    reusable: usize,
    /// When the slot was last released (larger is later).
    released_at: u64,
}

/// Whether the positions of a prefill chunk of `n` tokens may be reused by
/// later prompts of a server that prefills in chunks of `chunk`: a prompt
/// alone computes them in the same kind of chunk (several tokens when
/// `chunk >= 2`, one otherwise).
pub fn reusable_chunk(n: usize, chunk: usize) -> bool {
    (n >= 2) == (chunk >= 2)
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
    /// `prompt` (among equals the least recently released, then the
    /// lowest), or `None` when every slot is busy. At least one prompt token
    /// is always left to prefill, so that the step yields the logits of the
    /// last one.
    pub fn acquire(&mut self, prompt: &[u32]) -> Option<Acquired> {
        let Acquired { slot, reused } = self.best_free(prompt)?;
        let s = &mut self.slots[slot];
        s.busy = true;
        s.tokens.truncate(reused);
        s.reusable = reused;
        Some(Acquired { slot, reused })
    }

    /// The slot [`Slots::acquire`] would take for `prompt`, without taking
    /// it.
    pub fn best_free(&self, prompt: &[u32]) -> Option<Acquired> {
        let (slot, reused) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.busy)
            .map(|(i, s)| (i, self.reuse_limit(&s.tokens, s.reusable, prompt)))
            .max_by_key(|&(i, reused)| {
                let s = &self.slots[i];
                (reused, Reverse(s.released_at), Reverse(i))
            })?;
        Some(Acquired { slot, reused })
    }

    /// How many leading tokens of `prompt` may be taken from a cache that
    /// holds `held`, of which the first `reusable` may be reused.
    pub fn reuse_limit(&self, held: &[u32], reusable: usize, prompt: &[u32]) -> usize {
        let common = held.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let reused = common.min(reusable).min(prompt.len().saturating_sub(1));
        // Alone, the last token shares its chunk with the one before it
        // unless it starts a chunk: then leave both to prefill.
        let last_alone = reused + 1 == prompt.len() && !reused.is_multiple_of(self.chunk);
        if self.chunk >= 2 && last_alone {
            reused - 1
        } else {
            reused
        }
    }

    /// Frees `slot`, which now holds `tokens`, of which the first
    /// `reusable` were computed in chunks that [`reusable_chunk`] accepts.
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
    fn reuse_stops_where_the_cache_stops_being_reusable() {
        let mut slots = Slots::new(2, 4);
        let first: Vec<u32> = (0..11).collect();
        let a = slots.acquire(&first).unwrap();
        assert_eq!(a, Acquired { slot: 0, reused: 0 });
        // The prompt of 11 was prefilled in chunks of 4, 4 and 3 tokens;
        // three generated tokens were fed after it.
        let mut held = first.clone();
        held.extend([100, 101, 102]);
        slots.release(0, held, 11);
        // The next turn starts with everything held; the prompt part is
        // reused, the generated tokens are not.
        let mut next: Vec<u32> = (0..11).collect();
        next.extend([100, 101, 102, 7, 7]);
        assert_eq!(
            slots.acquire(&next),
            Some(Acquired {
                slot: 0,
                reused: 11
            })
        );
    }

    #[test]
    fn a_last_token_is_never_left_alone_where_the_prompt_alone_would_not_be() {
        let prompt: Vec<u32> = (0..17).collect();
        let mut slots = Slots::new(1, 4);
        slots.acquire(&prompt).unwrap();
        slots.release(0, prompt.clone(), 17);
        // 17 tokens: alone, the last one is a chunk of its own (16..17).
        assert_eq!(slots.acquire(&prompt).unwrap().reused, 16);
        slots.release(0, prompt.clone(), 17);
        // 16 tokens: alone, 15 shares the chunk 12..16, so 14 and 15 are
        // prefilled together.
        assert_eq!(slots.acquire(&prompt[..16]).unwrap().reused, 14);
        // With chunks of one token everything but the last is reused.
        let mut single = Slots::new(1, 1);
        single.acquire(&prompt).unwrap();
        single.release(0, prompt.clone(), 17);
        assert_eq!(single.acquire(&prompt[..16]).unwrap().reused, 15);
    }

    #[test]
    fn chunks_are_reusable_when_a_prompt_alone_makes_the_same_kind() {
        assert!(reusable_chunk(2, 64));
        assert!(reusable_chunk(64, 64));
        assert!(!reusable_chunk(1, 64));
        assert!(reusable_chunk(1, 1));
        assert!(!reusable_chunk(5, 1));
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
