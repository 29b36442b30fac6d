//! Software prefetch of the kernels' weight streams: into L2 ahead of the
//! tile that reads them from memory, and into L1 ahead of every tile.
//! (Decode attention reads its KV-cache rows ahead with plain loads
//! instead, see `KvRows::stream_rows`.)
//!
//! Decode reads every weight once, from memory. A kernel on its own keeps
//! too few cache misses in flight: one thread streamed a 39 MB packed Q4_K
//! matrix through the two-group kernel at 9-13 GB/s where the machine reads
//! 23-30 GB/s. So the decode kernels (one activation row) ask, block by
//! block, for the bytes each stream will read [`AHEAD`] bytes later, into
//! the L2 cache (the L1 prefetcher takes them from there); the same matrix
//! then streamed at 17-24 GB/s. The one-group AVX2 kernels gained as much:
//! on an AVX-512 Xeon capped at AVX2, decode rose 28-84 % over the Q4_1,
//! Q4_K_M and Q8_0 files. With several rows only the first tile of rows
//! over a span of groups reads memory: the caller says which tile that is
//! ([`WeightReads`]), and [`Streams`] prefetches for that tile alone. A
//! batched decode step (a server's 4 or 16 sequences) is such a first
//! tile, and without the prefetch its products waited for memory and then
//! computed, one after the other: 4 rows of a 1536 x 576 Q4_1 matrix from
//! memory on two threads ran at 67-74 GMAC/s without it, 90-107 with it.
//! For the later tiles, which find the groups in L2, the prefetches would
//! cost more than they save.
//!
//! The kernels keep a [`Streams`] cursor per tile: its target moves on by
//! one block per step, where computing it afresh for every block took an
//! integer division (the two-group kernels read two streams, whose targets
//! jump to the next pair of groups). With the weights in L2, one thread's
//! two-group Q8_0 decode kernel ran 10 % faster for it; on whole models
//! decode, bound by memory, moved within the noise.
//!
//! In prefill the groups sit in L2 once the first tile of rows has read
//! them, and the kernels read them fast enough that L1 misses showed: with
//! more than one row they ask for each line [`L1_AHEAD`] bytes early
//! ([`into_l1`], [`block_into_l1`]), by a plain offset from the block they
//! read. One thread's AVX-512 f16 kernel over 2048 x 8192 weights and
//! 36-128 rows went from 54-60 to 62-72 GMAC/s, the AVX2 one from 34-38 to
//! 39-41; the 1.1B F16 prefill rose 3-7 %, the quantized files' 0.7-3.5 %
//! (alternated whole-model runs). A [`Streams`] cursor in their place cost
//! the f16 kernels more in upkeep than the prefetch saved.
//!
//! Decode (one row) asks for the same lines too, on top of the L2 stream:
//! a decode kernel's loads then find them in L1 instead of waiting on L2
//! while its products hold the vector ports. On a Sapphire Rapids class
//! Xeon the 1.1B Q4_K_M decoded 4.5 % faster (1.014-1.094, eight
//! alternated rounds), the 1.1B Q8_0 2.3 %; capped at AVX2, 8.4 % and
//! 10.0 %, at AVX-VNNI the Q4_K_M 6.2 %; the 1.1B F16 1.9 % (0.7 % at
//! AVX2); SmolLM2's Q4_1, which decodes partly from the host's L3, within
//! the noise.
//!
//! A prefetch never faults, so addresses past the end of the weights (from
//! the last groups of a matrix) are harmless: the pointers are formed with
//! `wrapping_add` and never dereferenced.

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};

use crate::cpu::kernels::packed::WeightReads;
use crate::cpu::kernels::CACHE_LINE as LINE;

/// Bytes ahead of the current read position of each weight stream that
/// the decode kernels prefetch into L2.
pub(crate) const AHEAD: usize = 4096;

/// [`AHEAD`] for the two-group K-quant kernels of the AVX-512 level (Q4_K,
/// Q5_K, Q6_K). On a Sapphire Rapids class Xeon the 1.1B Q4_K_M decoded
/// 2-4 % faster with 2048 bytes ahead than with 4096 (medians of three
/// runs of 6-8 alternated rounds: 4.4 %, 1.9 %, 2.2 %; 1536 and 3072 gave
/// as much as 2048); the one-group AVX2 K-quant kernels moved within the
/// noise (0.5 %), and the other two-group kernels lost with less
/// (SmolLM2's Q4_1 14 %, its Q8_0 7 %).
pub(crate) const K_QUANT_PAIR_AHEAD: usize = 2048;

/// Bytes ahead of its current read position that a kernel asks for in L1
/// ([`into_l1`]).
pub(crate) const L1_AHEAD: usize = 2048;

/// Asks for the line [`L1_AHEAD`] bytes past the start of `at` in the L1
/// cache: for every tile of rows, whether its groups come from L2 (a
/// prefill's later tiles) or from memory behind an L2 stream (see the
/// module documentation).
#[inline(always)]
pub(crate) fn into_l1(at: &[u8]) {
    line_into_l1(at.as_ptr());
}

/// Bytes ahead of its current read position in a tile panel that the
/// AVX-512 f16/bf16 kernel asks for in L1 ([`panel_into_l1`]).
pub(crate) const PANEL_AHEAD: usize = 1024;

/// Asks for the two lines [`PANEL_AHEAD`] and that plus [`LINE`] bytes past
/// the start of `at` in the L1 cache: for the tile panels of the AVX-512
/// f16/bf16 kernel, which read 96 bytes a step (more than a line) from L2
/// when the panel and a pair of groups outgrow L1. The 1.1B F16 model's
/// 128-token prefill rose 3-6 % (2048 ahead: no steadier gain).
#[inline(always)]
pub(crate) fn panel_into_l1(at: &[f32]) {
    let line = at.as_ptr().cast::<i8>().wrapping_add(PANEL_AHEAD);
    // SAFETY: SSE is part of every x86-64 CPU, and a prefetch only hints
    // the cache: it never faults and reads nothing into the program,
    // whatever the address.
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(line);
        _mm_prefetch::<_MM_HINT_T0>(line.wrapping_add(LINE));
    }
}

/// [`into_l1`] for the lines of a block of `len` bytes at `at` (one every
/// [`LINE`] bytes from its start).
#[inline(always)]
pub(crate) fn block_into_l1(at: &[u8], len: usize) {
    for offset in block_points(len) {
        line_into_l1(at.as_ptr().wrapping_add(offset));
    }
}

/// Asks for every cache line of `at` in the L2 cache: for a kernel that
/// knows which bytes it reads next but does not read them in order (the
/// AMX tile kernels go piece by piece across group pairs, see
/// `amx::next_piece_into_l2`).
#[inline(always)]
pub(crate) fn into_l2(at: &[u8]) {
    lines(at.as_ptr(), at.len());
}

/// Asks for the line [`L1_AHEAD`] bytes past `p` in the L1 cache.
#[inline(always)]
fn line_into_l1(p: *const u8) {
    let line = p.cast::<i8>().wrapping_add(L1_AHEAD);
    // SAFETY: SSE is part of every x86-64 CPU, and a prefetch only hints
    // the cache: it never faults and reads nothing into the program,
    // whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(line) };
}

/// Offsets from `addr` of the cache lines that start within the `len`
/// bytes at `addr`: adjacent ranges name every line exactly once.
fn line_starts(addr: usize, len: usize) -> impl Iterator<Item = usize> {
    let first = addr.next_multiple_of(LINE) - addr;
    (first..len).step_by(LINE)
}

/// Prefetches the cache lines that start within the `len` bytes at `p`.
#[inline(always)]
fn lines(p: *const u8, len: usize) {
    for at in line_starts(p as usize, len) {
        // SAFETY: SSE is part of every x86-64 CPU, and a prefetch only
        // hints the cache: it never faults and reads nothing into the
        // program, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(at).cast()) };
    }
}

/// Offsets within a block of `len` bytes that [`Streams::next`] prefetches:
/// one every [`LINE`] bytes from the block's start, whatever its alignment.
/// Points less than a line apart name every line they span, and the last
/// point of a block lies less than a line before the next block's first,
/// so blocks read one after another have every line asked for (some
/// twice). A fixed count, where naming each line exactly once (as
/// [`lines`] does) depends on the alignment: the branches that took cost
/// the two-group Q4_K decode kernel a fifth of its speed with the weights
/// in L2, and whole-model decode rose 6-8 % (SmolLM2 Q4_1, 1B Q4_K_M)
/// without them.
fn block_points(len: usize) -> impl Iterator<Item = usize> {
    (0..len.div_ceil(LINE)).map(|k| k * LINE)
}

/// Where, from the start of the first of `streams` consecutive groups of
/// `group` bytes read side by side (offset `at` of each at once), set
/// after set in memory order, the first stream reads `ahead` bytes after
/// offset `at` (stream `s` reads `s·group` bytes further on).
fn side_by_side_target(streams: usize, group: usize, at: usize, ahead: usize) -> usize {
    let to = at + ahead;
    streams * (to / group) * group + to % group
}

/// Prefetch for a kernel reading `streams` consecutive groups side by
/// side (offset `at` of each at once), set after set in memory order,
/// where `first` is the set's first group: the `len` bytes each stream
/// reads [`AHEAD`] bytes later, in this set or in a later one.
#[inline(always)]
pub(crate) fn side_by_side<T>(first: &[T], streams: usize, at: usize, len: usize) {
    let group = std::mem::size_of_val(first);
    if group == 0 {
        return;
    }
    let target = first
        .as_ptr()
        .cast::<u8>()
        .wrapping_add(side_by_side_target(streams, group, at, AHEAD));
    for s in 0..streams {
        lines(target.wrapping_add(s * group), len);
    }
}

/// The prefetch of a decode kernel's weight streams, block after block:
/// `streams` consecutive groups read side by side (one for the one-group
/// kernels, two for the two-group ones), each read in blocks of the same
/// size from its start. Each [`Streams::next`] asks for the bytes each
/// stream reads [`AHEAD`] bytes after the block it is about to read, as
/// [`side_by_side`] does, but the target moves on by a block at a time,
/// so the block loop pays no division for it. It prefetches only for a
/// tile whose weights come from memory ([`WeightReads::FromMemory`]).
pub(crate) struct Streams {
    /// Start of the first group.
    first: *const u8,
    /// Bytes per group.
    group: usize,
    /// Groups read side by side.
    streams: usize,
    /// Offset of the target set of groups from `first`.
    set: usize,
    /// Offset of the target within its group.
    within: usize,
    /// Whether to prefetch at all (a tile reading from memory).
    on: bool,
}

impl Streams {
    /// The prefetch for `streams` groups side by side, `first` the first
    /// of them, for a tile of rows whose weights come from `reads`.
    #[inline(always)]
    pub(crate) fn new<T>(first: &[T], streams: usize, reads: WeightReads) -> Streams {
        Self::with_ahead(first, streams, reads, AHEAD)
    }

    /// [`Streams::new`] asking for the bytes each stream reads `ahead`
    /// bytes later, where [`AHEAD`] is not the best distance.
    #[inline(always)]
    pub(crate) fn with_ahead<T>(
        first: &[T],
        streams: usize,
        reads: WeightReads,
        ahead: usize,
    ) -> Streams {
        let group = std::mem::size_of_val(first);
        let on = reads == WeightReads::FromMemory && group > 0;
        let (set, within) = if on {
            let target = side_by_side_target(streams, group, 0, ahead);
            (target - target % group, target % group)
        } else {
            (0, 0)
        };
        Streams {
            first: first.as_ptr().cast(),
            group,
            streams,
            set,
            within,
            on,
        }
    }

    /// Prefetches the `len` bytes each stream reads [`AHEAD`] (or the
    /// distance it was made with) bytes after the block of `len` bytes it
    /// reads next, then moves on by that block.
    #[inline(always)]
    pub(crate) fn next(&mut self, len: usize) {
        if !self.on {
            return;
        }
        let target = self.first.wrapping_add(self.set + self.within);
        for s in 0..self.streams {
            let at = target.wrapping_add(s * self.group);
            for offset in block_points(len) {
                // SAFETY: SSE is part of every x86-64 CPU, and a prefetch
                // only hints the cache: it never faults and reads nothing
                // into the program, whatever the address.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(offset).cast()) };
            }
        }
        self.within += len;
        if self.within >= self.group {
            self.within -= self.group;
            self.set += self.streams * self.group;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_ranges_name_each_line_once() {
        for start in [0usize, 1, 63, 64, 100] {
            for len in [1usize, 37, 64, 148, 210, 272] {
                let mut seen = Vec::new();
                for k in 0..20 {
                    let addr = start + k * len;
                    seen.extend(line_starts(addr, len).map(|o| addr + o));
                }
                let end = start + 20 * len;
                let want: Vec<usize> = (start.next_multiple_of(LINE)..end).step_by(LINE).collect();
                assert_eq!(seen, want, "start {start}, len {len}");
            }
        }
    }

    #[test]
    fn block_points_name_every_line_of_consecutive_blocks() {
        for start in [0usize, 1, 20, 63, 64, 100] {
            for len in [34usize, 64, 148, 210, 272, 512] {
                let mut seen = std::collections::BTreeSet::new();
                for k in 0..40 {
                    let addr = start + k * len;
                    seen.extend(block_points(len).map(|o| (addr + o) / LINE));
                }
                // Every line up to the one where block 40 starts (that
                // block's first point takes the last one).
                seen.insert((start + 40 * len) / LINE);
                let (first, last) = (start / LINE, (start + 40 * len) / LINE);
                let want: std::collections::BTreeSet<usize> = (first..=last).collect();
                assert_eq!(seen, want, "start {start}, len {len}");
                assert_eq!(block_points(len).count(), len.div_ceil(LINE));
            }
        }
    }

    #[test]
    fn streams_move_on_as_the_division_says() {
        let bytes = vec![0u8; 1];
        for (streams, group, len) in [
            (1, 1184, 148),
            (2, 1184, 148),
            (2, 2880, 160),
            (2, 272, 272),
            (1, 64, 64),
        ] {
            let first = vec![0u8; group];
            for ahead in [AHEAD, K_QUANT_PAIR_AHEAD, 100] {
                let reads = WeightReads::FromMemory;
                let mut cursor = Streams::with_ahead(&first, streams, reads, ahead);
                for i in 0..3 * AHEAD / len {
                    let at = i * len;
                    let want = streams * (at / group) * group
                        + side_by_side_target(streams, group, at % group, ahead);
                    assert_eq!(
                        cursor.set + cursor.within,
                        want,
                        "{streams} streams, group {group}, {ahead} ahead, block {i}"
                    );
                    cursor.next(len);
                }
            }
        }
        assert!(
            !Streams::new(&bytes, 2, WeightReads::FromCache).on,
            "weights in cache"
        );
        assert!(
            !Streams::new(&bytes[..0], 2, WeightReads::FromMemory).on,
            "empty group"
        );
    }

    #[test]
    fn targets_follow_the_streams_into_later_sets() {
        // Pairs of groups of 100 bytes: pair p's first group starts at 200·p.
        assert_eq!(side_by_side_target(2, 100, 10, 50), 60);
        assert_eq!(side_by_side_target(2, 100, 60, 50), 210);
        assert_eq!(side_by_side_target(2, 100, 0, 100), 200);
        assert_eq!(side_by_side_target(2, 100, 99, 301), 800);
        // One stream reads straight on; four rows of 10 side by side.
        assert_eq!(side_by_side_target(1, 100, 99, 301), 400);
        assert_eq!(side_by_side_target(4, 10, 3, 8), 41);
        // Against the kernel's reads in time order: after `t` bytes of
        // each stream, the first one reads at `addr(t)` from the first pair.
        for streams in 1..=4 {
            let addr = |t: usize, group: usize| streams * (t / group) * group + t % group;
            for (group, len) in [(1184, 148), (13440, 210), (2880, 160), (1152, 512)] {
                for p in 0..4 {
                    for at in (0..group).step_by(len) {
                        let t = p * group + at;
                        assert_eq!(
                            streams * p * group + side_by_side_target(streams, group, at, AHEAD),
                            addr(t + AHEAD, group),
                            "{streams} streams, group {group}, set {p}, offset {at}"
                        );
                    }
                }
            }
        }
    }
}
