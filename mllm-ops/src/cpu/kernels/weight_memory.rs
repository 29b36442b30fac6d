//! Memory for the weights repacked at load.
//!
//! Decode streams every weight byte once per token, so the page walks of
//! 4 KiB pages cost a share of the bandwidth (`examples/membw` reads 4 KiB
//! pages at about two thirds of the speed of 2 MiB ones). Memory for
//! repacked weights is therefore advised as transparent huge pages (on
//! Linux; elsewhere, and where the kernel says no, it keeps small pages).
//!
//! A model's linear layers take it from one [`WeightArena`]: a few large
//! reservations of address space, advised whole, handed out back to back.
//! So every matrix sits on huge pages, however small, and none leaves a
//! partly used huge page behind. When each matrix had a buffer of its own,
//! a 1B model's matrices of 0.6-9.7 MB kept about a seventh of their bytes
//! on small pages (those under 2 MiB all of them); in one arena its
//! Q4_K_M file decodes 1.09x as fast, and SmolLM2's Q4_1 file, whose
//! matrices are all under 2 MiB, 1.06x.
//! [`WeightMemory::zeroed`] makes a buffer of its own, for packing outside
//! a model: only its whole huge pages are advised, so its resident size
//! stays the bytes written, as with a `Vec`.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use mllm_core::{Error, Result};

/// Size of a transparent huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;
/// Address space an arena reserves at a time (more for a larger buffer).
/// Only the pages written become resident.
const CHUNK: usize = 1 << 30;
/// Alignment of each buffer in an arena (a cache line).
const ALIGN: usize = 64;
/// Size of a small page, the unit in which an arena gives back memory.
const PAGE: usize = 4096;

/// A zeroed byte buffer for repacked weights (see the module
/// documentation).
pub struct WeightMemory(Storage);

/// Where a [`WeightMemory`]'s bytes live.
enum Storage {
    /// A buffer smaller than a huge page.
    Small(Vec<u8>),
    /// `len` bytes from `start` of an anonymous mapping one huge page
    /// longer, `start` on a huge-page boundary.
    Mapped {
        map: memmap2::MmapMut,
        start: usize,
        len: usize,
    },
    /// `len` bytes at `offset` of an arena's chunk.
    Arena {
        chunk: Arc<Chunk>,
        offset: usize,
        len: usize,
    },
}

impl WeightMemory {
    /// `len` zero bytes; fails when the system cannot map them.
    pub fn zeroed(len: usize) -> Result<WeightMemory> {
        if len < HUGE_PAGE {
            return Ok(WeightMemory(Storage::Small(vec![0; len])));
        }
        let map = memmap2::MmapMut::map_anon(len + HUGE_PAGE).map_err(|e| {
            Error::Device(format!(
                "cpu: cannot map {len} bytes for repacked weights: {e}"
            ))
        })?;
        let start = (HUGE_PAGE - map.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
        #[cfg(target_os = "linux")]
        {
            // A hint: a kernel without transparent huge pages refuses it
            // and the buffer keeps small pages.
            let whole = len / HUGE_PAGE * HUGE_PAGE;
            let _ = map.advise_range(memmap2::Advice::HugePage, start, whole);
        }
        Ok(WeightMemory(Storage::Mapped { map, start, len }))
    }

    /// `len` zero bytes from `arena` ([`WeightArena::alloc`]), or a buffer
    /// of their own ([`WeightMemory::zeroed`]) without one.
    pub fn zeroed_in(arena: Option<&WeightArena>, len: usize) -> Result<WeightMemory> {
        match arena {
            Some(arena) => arena.alloc(len),
            None => WeightMemory::zeroed(len),
        }
    }
}

impl Deref for WeightMemory {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Storage::Small(v) => v,
            Storage::Mapped { map, start, len } => &map[*start..*start + *len],
            Storage::Arena { chunk, offset, len } => {
                // SAFETY: `offset..offset + len` lies inside the chunk's
                // mapping (checked when the arena handed it out), the
                // `Arc` keeps the mapping alive, and the arena hands every
                // byte to one buffer only, whose `&self` this borrows.
                unsafe { std::slice::from_raw_parts(chunk.map.as_ptr().add(*offset), *len) }
            }
        }
    }
}

impl DerefMut for WeightMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Storage::Small(v) => v,
            Storage::Mapped { map, start, len } => &mut map[*start..*start + *len],
            Storage::Arena { chunk, offset, len } => {
                // SAFETY: as in `deref`; `&mut self` makes this the only
                // borrow of these bytes, which no other buffer shares.
                unsafe { std::slice::from_raw_parts_mut(chunk.map.as_mut_ptr().add(*offset), *len) }
            }
        }
    }
}

/// Zero-filled buffers for the repacked weights of one model, handed out
/// back to back from large reservations advised as huge pages (see the
/// module documentation). Buffers keep their chunk alive; the arena can
/// go before them.
#[derive(Default)]
pub struct WeightArena {
    /// The chunk buffers come from, and the bytes of it handed out.
    current: Mutex<Option<(Arc<Chunk>, usize)>>,
}

/// One reservation of address space of an arena.
struct Chunk {
    /// The mapping, one huge page longer than `capacity`.
    map: memmap2::MmapRaw,
    /// Offset in `map` of its first huge-page boundary, where buffers start.
    base: usize,
    /// Bytes usable from `base`.
    capacity: usize,
}

impl Chunk {
    /// A reservation of at least `len` bytes, advised as huge pages.
    fn reserve(len: usize) -> std::io::Result<Chunk> {
        let capacity = len.max(CHUNK).next_multiple_of(HUGE_PAGE);
        let map = memmap2::MmapOptions::new()
            .len(capacity + HUGE_PAGE)
            .no_reserve_swap()
            .map_anon()?;
        let base = (HUGE_PAGE - map.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
        #[cfg(target_os = "linux")]
        {
            // A hint, as in `WeightMemory::zeroed`.
            let _ = map.advise_range(memmap2::Advice::HugePage, base, capacity);
        }
        Ok(Chunk {
            map: map.into(),
            base,
            capacity,
        })
    }

    /// Gives the pages from `used` (rounded up to a page) to the end back
    /// to the system: no buffer holds them, and a huge page that a buffer
    /// only partly fills stays resident otherwise. They read as zeros when
    /// touched again.
    fn release_after(&self, used: usize) {
        let from = used.next_multiple_of(PAGE).min(self.capacity);
        if from == self.capacity {
            return;
        }
        #[cfg(unix)]
        {
            // SAFETY: every buffer of this chunk ends at or before `used`,
            // so no reference reaches the released range; a private
            // anonymous mapping reads zeros there afterwards, which is what
            // the buffers handed out later must start as.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    self.base + from,
                    self.capacity - from,
                )
            };
        }
    }
}

impl WeightArena {
    /// An arena that has reserved nothing yet.
    pub fn new() -> WeightArena {
        WeightArena::default()
    }

    /// `len` zero bytes, after the last buffer handed out; a new
    /// reservation when the current one is full (the old one's unused
    /// pages given back). Where the system refuses a reservation, the
    /// buffer is made on its own (as [`WeightMemory::zeroed`]).
    pub fn alloc(&self, len: usize) -> Result<WeightMemory> {
        if len == 0 {
            return Ok(WeightMemory(Storage::Small(Vec::new())));
        }
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let fits = |(chunk, used): &(Arc<Chunk>, usize)| {
            let at = used.next_multiple_of(ALIGN);
            (at.checked_add(len)? <= chunk.capacity).then_some(at)
        };
        let at = match current.as_ref().and_then(fits) {
            Some(at) => at,
            None => {
                let Ok(chunk) = Chunk::reserve(len) else {
                    return WeightMemory::zeroed(len);
                };
                if let Some((old, used)) = current.take() {
                    old.release_after(used);
                }
                *current = Some((Arc::new(chunk), 0));
                0
            }
        };
        let (chunk, used) = current.as_mut().expect("a chunk was just set");
        *used = at + len;
        Ok(WeightMemory(Storage::Arena {
            offset: chunk.base + at,
            chunk: Arc::clone(chunk),
            len,
        }))
    }

    /// Gives the current reservation's pages after the last buffer back to
    /// the system (see `Chunk::release_after`); for when loading is done.
    /// Later buffers still come from them.
    pub fn trim(&self) {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((chunk, used)) = current.as_ref() {
            chunk.release_after(*used);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_writable_and_exactly_as_long_as_asked() {
        for len in [0, 1, 4096, HUGE_PAGE - 1, HUGE_PAGE, 3 * HUGE_PAGE + 12345] {
            let mut m = WeightMemory::zeroed(len).unwrap();
            assert_eq!(m.len(), len);
            assert!(m.iter().all(|&b| b == 0), "{len} bytes not zeroed");
            for (i, b) in m.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            assert!(m.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        }
    }

    #[test]
    fn large_buffers_start_on_a_huge_page_boundary() {
        let m = WeightMemory::zeroed(HUGE_PAGE + 1).unwrap();
        assert!(matches!(m.0, Storage::Mapped { .. }));
        assert_eq!(m.as_ptr() as usize % HUGE_PAGE, 0);
        let small = WeightMemory::zeroed(HUGE_PAGE - 1).unwrap();
        assert!(matches!(small.0, Storage::Small(_)));
    }

    /// The address range of the mapping of `/proc/self/smaps` that holds
    /// `addr`, and the value of its line starting with `field`.
    #[cfg(target_os = "linux")]
    fn smaps_line(addr: usize, field: &str) -> (usize, usize, String) {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut range = None;
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = head.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    range = Some((a, b));
                    continue;
                }
            }
            if let (Some((a, b)), Some(value)) = (range, line.strip_prefix(field)) {
                if (a..b).contains(&addr) {
                    return (a, b, value.to_string());
                }
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    /// The address range and `VmFlags` of the mapping that holds `addr`.
    #[cfg(target_os = "linux")]
    fn mapping_of(addr: usize) -> (usize, usize, String) {
        smaps_line(addr, "VmFlags:")
    }

    /// Resident kilobytes of the mapping that holds `addr`.
    #[cfg(target_os = "linux")]
    fn resident_kib(addr: usize) -> usize {
        let (_, _, rss) = smaps_line(addr, "Rss:");
        rss.trim().trim_end_matches("kB").trim().parse().unwrap()
    }

    /// Whether this process can see its huge-page advice in
    /// `/proc/self/smaps`: the kernel has transparent huge pages, and the
    /// tests do not run under a user-mode emulator (qemu-user takes
    /// `madvise(MADV_HUGEPAGE)` as a hint it drops; `scripts/test-aarch64.sh`
    /// sets `MLLM_TEST_EMULATED`).
    #[cfg(target_os = "linux")]
    fn advice_is_observable() -> bool {
        std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists()
            && std::env::var_os("MLLM_TEST_EMULATED").is_none()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn exactly_the_whole_huge_pages_are_advised() {
        if !advice_is_observable() {
            return;
        }
        let m = WeightMemory::zeroed(3 * HUGE_PAGE + 12345).unwrap();
        let start = m.as_ptr() as usize;
        let (a, b, flags) = mapping_of(start);
        assert_eq!((a, b), (start, start + 3 * HUGE_PAGE), "{flags}");
        assert!(flags.split_whitespace().any(|f| f == "hg"), "{flags}");
        let (a, _, flags) = mapping_of(start + 3 * HUGE_PAGE);
        assert_eq!(a, start + 3 * HUGE_PAGE);
        assert!(
            !flags.split_whitespace().any(|f| f == "hg"),
            "tail: {flags}"
        );
    }

    /// Fills `m` with a pattern of `seed`.
    fn fill(m: &mut [u8], seed: usize) {
        for (i, b) in m.iter_mut().enumerate() {
            *b = ((i * 7 + seed) % 251) as u8;
        }
    }

    /// Whether `m` holds the pattern of `seed`.
    fn holds(m: &[u8], seed: usize) -> bool {
        m.iter()
            .enumerate()
            .all(|(i, &b)| b == ((i * 7 + seed) % 251) as u8)
    }

    #[test]
    fn arena_buffers_are_zeroed_aligned_and_apart() {
        let arena = WeightArena::new();
        let lens = [1, 63, 64, 4096, 100_000, HUGE_PAGE - 1, HUGE_PAGE + 5, 0, 7];
        let mut bufs: Vec<WeightMemory> = lens.iter().map(|&n| arena.alloc(n).unwrap()).collect();
        assert_eq!(bufs[0].as_ptr() as usize % HUGE_PAGE, 0, "first buffer");
        for (i, (m, &n)) in bufs.iter_mut().zip(&lens).enumerate() {
            assert_eq!(m.len(), n);
            assert!(m.iter().all(|&b| b == 0), "buffer {i} not zeroed");
            if n > 0 {
                assert!(matches!(m.0, Storage::Arena { .. }), "buffer {i}");
                assert_eq!(m.as_ptr() as usize % ALIGN, 0, "buffer {i}");
            }
            fill(m, i);
        }
        for (i, m) in bufs.iter().enumerate() {
            assert!(holds(m, i), "buffer {i} overwritten");
        }
        let mut spans: Vec<(usize, usize)> = bufs
            .iter()
            .filter(|m| !m.is_empty())
            .map(|m| (m.as_ptr() as usize, m.as_ptr() as usize + m.len()))
            .collect();
        spans.sort();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{spans:x?}");
    }

    #[test]
    fn a_full_reservation_is_followed_by_a_new_one() {
        let arena = WeightArena::new();
        let mut big = arena.alloc(CHUNK - 100).unwrap();
        let n = big.len();
        fill(&mut big[n - PAGE..], 1);
        let mut next = arena.alloc(200).unwrap();
        assert!(next.iter().all(|&b| b == 0));
        fill(&mut next, 2);
        let (b, x) = (big.as_ptr() as usize, next.as_ptr() as usize);
        assert!(
            x >= b + n || x + 200 <= b,
            "the new buffer overlaps the full chunk"
        );
        assert!(
            holds(&big[n - PAGE..], 1),
            "released past the last buffer's end"
        );
        let huge = arena.alloc(CHUNK + 1).unwrap();
        assert_eq!(huge.len(), CHUNK + 1);
        drop(arena);
        assert!(holds(&next, 2), "buffers outlive their arena");
    }

    #[test]
    fn trimming_keeps_the_buffers_and_later_ones_start_zeroed() {
        let arena = WeightArena::new();
        let mut a = arena.alloc(3 * PAGE + 10).unwrap();
        fill(&mut a, 3);
        #[cfg(target_os = "linux")]
        let before = resident_kib(a.as_ptr() as usize);
        arena.trim();
        assert!(holds(&a, 3));
        #[cfg(target_os = "linux")]
        {
            let after = resident_kib(a.as_ptr() as usize);
            assert!(
                after <= 4 * PAGE / 1024,
                "{before} kB before, {after} kB after"
            );
        }
        let mut b = arena.alloc(5 * PAGE).unwrap();
        assert!(b.iter().all(|&v| v == 0), "a trimmed page was not zero");
        fill(&mut b, 4);
        assert!(holds(&a, 3) && holds(&b, 4));
    }

    #[test]
    fn threads_share_an_arena() {
        let arena = WeightArena::new();
        let bufs: Vec<(usize, WeightMemory)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|t| {
                    let arena = &arena;
                    s.spawn(move || {
                        (0..50)
                            .map(|i| {
                                let seed = t * 1000 + i;
                                let mut m = arena.alloc(100 + 37 * i).unwrap();
                                assert!(m.iter().all(|&b| b == 0));
                                fill(&mut m, seed);
                                (seed, m)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(bufs.len(), 200);
        assert!(bufs.iter().all(|(seed, m)| holds(m, *seed)));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn an_arena_is_advised_as_huge_pages() {
        if !advice_is_observable() {
            return;
        }
        let arena = WeightArena::new();
        let m = arena.alloc(1000).unwrap();
        let (a, b, flags) = mapping_of(m.as_ptr() as usize);
        assert_eq!((a, b - a), (m.as_ptr() as usize, CHUNK), "{flags}");
        assert!(flags.split_whitespace().any(|f| f == "hg"), "{flags}");
    }
}
