//! The read-only bytes of a model file. Every reader of untrusted files
//! (`.mllm`, GGUF, safetensors) gets its bytes here, so the one `unsafe`
//! memory map is in one place. Under Miri, which cannot map files, the
//! file is read into an 8-byte-aligned buffer instead, so the parsers'
//! tests run there unchanged.

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use crate::{Error, Result};

/// A file's bytes, memory-mapped read-only.
pub struct MappedFile {
    #[cfg(not(miri))]
    map: memmap2::Mmap,
    #[cfg(miri)]
    words: Vec<u64>,
    #[cfg(miri)]
    len: usize,
}

impl MappedFile {
    /// Maps `file` (opened from `path`, which errors name).
    ///
    /// mllm-rs never writes a file in place (writers rename a finished
    /// temporary file over the old one), and a reader's input is not
    /// expected to change while it is open; every reader bounds-checks its
    /// accesses against the slice's length.
    pub fn map(file: &File, path: &Path) -> Result<Self> {
        #[cfg(not(miri))]
        {
            // SAFETY: the map is read-only and private to this process; its
            // bytes change only if another process rewrites the file in
            // place while it is open, which the contract above excludes
            // (as it must for any memory-mapped reader).
            let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| Error::io(path, e))?;
            Ok(MappedFile { map })
        }
        #[cfg(miri)]
        {
            use std::io::Read;
            let mut bytes = Vec::new();
            let mut reader = file;
            reader
                .read_to_end(&mut bytes)
                .map_err(|e| Error::io(path, e))?;
            let mut words = vec![0u64; bytes.len().div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(&bytes);
            Ok(MappedFile {
                words,
                len: bytes.len(),
            })
        }
    }

    /// Opens and maps the file at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        Self::map(&file, path)
    }

    /// Tells the OS that the pages of `start..start + len` are not needed
    /// in memory any more; later reads fault them back in from the file.
    /// Failure, or a system without such advice, leaves them resident.
    pub fn release(&self, start: usize, len: usize) {
        #[cfg(all(unix, not(miri)))]
        {
            use memmap2::UncheckedAdvice;
            if start
                .checked_add(len)
                .is_none_or(|end| end > self.map.len())
            {
                return;
            }
            // SAFETY: the map is a read-only mapping of a file that does not
            // change while open (see `map`); dropping its pages only makes
            // later reads fault them back in with the same contents, so no
            // reference into the map observes a change. The range is inside
            // the map (checked above).
            let _ = unsafe {
                self.map
                    .unchecked_advise_range(UncheckedAdvice::DontNeed, start, len)
            };
        }
        #[cfg(not(all(unix, not(miri))))]
        let _ = (start, len);
    }
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedFile({} bytes)", self.len())
    }
}

impl Deref for MappedFile {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        #[cfg(not(miri))]
        {
            &self.map
        }
        #[cfg(miri)]
        {
            &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_the_bytes_of_a_file_and_survives_releasing_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bytes");
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let mapped = MappedFile::open(&path).unwrap();
        assert_eq!(&mapped[..], &bytes[..]);
        mapped.release(4096, 4096);
        mapped.release(9_000, 5_000);
        mapped.release(usize::MAX, 2);
        assert_eq!(&mapped[..], &bytes[..]);
    }

    #[test]
    fn a_missing_file_is_an_io_error_naming_it() {
        let err = MappedFile::open(Path::new("/nonexistent/model.mllm"))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("/nonexistent/model.mllm"), "{err}");
    }
}
