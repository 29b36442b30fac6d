//! Memory for the weights repacked at load.
//!
//! Decode streams every weight byte once per token, so the page walks of
//! 4 KiB pages cost a share of the bandwidth. A buffer of at least one huge
//! page is an anonymous mapping whose whole 2 MiB pages are advised as
//! transparent huge pages (on Linux; elsewhere, and where the kernel says
//! no, it keeps small pages). Only whole huge pages inside the buffer are
//! advised, so the resident size stays the bytes written, as with a
//! `Vec`.

use std::ops::{Deref, DerefMut};

use mllm_core::{Error, Result};

/// Size of a transparent huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

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
}

impl Deref for WeightMemory {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Storage::Small(v) => v,
            Storage::Mapped { map, start, len } => &map[*start..*start + *len],
        }
    }
}

impl DerefMut for WeightMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Storage::Small(v) => v,
            Storage::Mapped { map, start, len } => &mut map[*start..*start + *len],
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

    /// The address range and `VmFlags` of the mapping of `/proc/self/smaps`
    /// that holds `addr`.
    #[cfg(target_os = "linux")]
    fn mapping_of(addr: usize) -> (usize, usize, String) {
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
            if let (Some((a, b)), Some(flags)) = (range, line.strip_prefix("VmFlags:")) {
                if (a..b).contains(&addr) {
                    return (a, b, flags.to_string());
                }
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn exactly_the_whole_huge_pages_are_advised() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
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
}
