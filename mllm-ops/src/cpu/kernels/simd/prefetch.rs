//! Software prefetch of the packed kernels' weight streams.
//!
//! Decode reads every packed weight once, from memory, and the kernels
//! spend enough instructions per byte that out-of-order execution alone
//! keeps too few cache misses in flight: one thread streamed a 39 MB
//! packed Q4_K matrix at 9-13 GB/s where the machine reads 23-30 GB/s. The
//! kernels therefore ask, block by block, for the bytes they will read
//! [`AHEAD`] bytes later, into the L2 cache (the L1 prefetcher takes them
//! from there); the same matrix then streamed at 17-24 GB/s.
//!
//! A prefetch never faults, so addresses past the end of the weights (from
//! the last groups of a matrix) are harmless: the pointers are formed with
//! `wrapping_add` and never dereferenced.

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};

/// Bytes ahead of the current read position of each weight stream that
/// the kernels prefetch.
pub(crate) const AHEAD: usize = 4096;

/// Cache line size.
const LINE: usize = 64;

/// Offsets from `addr` of the cache lines that start within the `len`
/// bytes at `addr`: adjacent ranges name every line exactly once.
fn line_starts(addr: usize, len: usize) -> impl Iterator<Item = usize> {
    let first = addr.next_multiple_of(LINE) - addr;
    (first..len).step_by(LINE)
}

/// Prefetches the cache lines that start within the `len` bytes at `p`.
#[target_feature(enable = "sse")]
#[inline]
fn lines(p: *const u8, len: usize) {
    for at in line_starts(p as usize, len) {
        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(at).cast());
    }
}

/// Prefetch for a kernel reading one group at a time, groups in memory
/// order: the `len` bytes [`AHEAD`] bytes after offset `at` of `group`
/// (in a later group once past its end).
#[target_feature(enable = "sse")]
#[inline]
pub(crate) fn single(group: &[u8], at: usize, len: usize) {
    lines(group.as_ptr().wrapping_add(at + AHEAD), len);
}

/// Where, from the start of the first group of a pair of consecutive
/// `group`-byte groups read side by side, pair after pair, the first
/// stream reads `ahead` bytes after offset `at` of each group (the second
/// stream reads `group` bytes further on).
fn pair_target(group: usize, at: usize, ahead: usize) -> usize {
    let to = at + ahead;
    2 * (to / group) * group + to % group
}

/// Prefetch for a kernel reading two consecutive groups side by side
/// (offset `at` of both at once), pair after pair in memory order, where
/// `a` is the first group of the pair: the `len` bytes each of the two
/// streams reads [`AHEAD`] bytes later, in this pair or in a later one.
#[target_feature(enable = "sse")]
#[inline]
pub(crate) fn pair(a: &[u8], at: usize, len: usize) {
    let group = a.len();
    if group == 0 {
        return;
    }
    let first = a.as_ptr().wrapping_add(pair_target(group, at, AHEAD));
    lines(first, len);
    lines(first.wrapping_add(group), len);
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
    fn pair_target_follows_both_streams_into_later_pairs() {
        // Groups of 100 bytes: pair p's first group starts at 200·p.
        assert_eq!(pair_target(100, 10, 50), 60);
        assert_eq!(pair_target(100, 60, 50), 210);
        assert_eq!(pair_target(100, 0, 100), 200);
        assert_eq!(pair_target(100, 99, 301), 800);
        // Against the kernel's reads in time order: after `t` bytes of
        // each stream, the first one reads at `addr(t)` from the first pair.
        let addr = |t: usize, group: usize| 2 * (t / group) * group + t % group;
        for (group, len) in [(1184, 148), (13440, 210), (2880, 160)] {
            for p in 0..4 {
                for at in (0..group).step_by(len) {
                    let t = p * group + at;
                    assert_eq!(
                        2 * p * group + pair_target(group, at, AHEAD),
                        addr(t + AHEAD, group),
                        "group {group}, pair {p}, offset {at}"
                    );
                }
            }
        }
    }
}
