//! Memory-mapped, fully validated reading of `.mllm` files.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;

use super::{MappedFile, Metadata, CHAT_TEMPLATE_ENTRY, MAGIC, META_ENTRY, TOKENIZER_ENTRY};
use crate::{DType, Error, Result, Shape};

/// One index entry of a `.mllm` file, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Element type.
    pub dtype: DType,
    /// Absolute byte offset of the data.
    pub offset: u64,
    /// Byte length of the data.
    pub len: u64,
}

/// An opened `.mllm` file: the validated index over a shared memory map.
///
/// Opening checks the magic, that the index lies inside the file, every
/// entry's name, dtype code and data range, and (when metadata is present)
/// that each tensor's byte size matches its recorded shape. Nothing is read
/// past those checks, so a corrupt file is an [`Error`], never a panic.
#[derive(Debug)]
pub struct MllmFile {
    path: PathBuf,
    file: Arc<File>,
    map: Arc<MappedFile>,
    entries: IndexMap<String, IndexEntry>,
    metadata: Option<Metadata>,
}

/// A zero-copy view of one tensor's bytes inside a mapped file.
#[derive(Clone, Debug)]
pub struct TensorData {
    name: String,
    dtype: DType,
    shape: Shape,
    file: Arc<File>,
    map: Arc<MappedFile>,
    start: usize,
    len: usize,
}

impl TensorData {
    /// The tensor's name in the file.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape (from the metadata, or the shape the caller asked for).
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The raw bytes, straight from the map.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }

    /// Reads the tensor's bytes `offset..offset + buf.len()` into `buf`
    /// with a positioned read of the file, without touching the map: for
    /// gathers of a few rows (an embedding lookup), which through the map
    /// would also bring a window of pages around each row into the resident
    /// set. Fails when the range is outside the tensor or the read fails.
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let end = offset.checked_add(buf.len()).filter(|&e| e <= self.len);
        if end.is_none() {
            return Err(Error::InvalidInput(format!(
                "tensor '{}': bytes {offset}..+{} are outside its {} bytes",
                self.name,
                buf.len(),
                self.len
            )));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileExt;
            let at = (self.start + offset) as u64;
            self.file.read_exact_at(buf, at).map_err(|e| {
                Error::InvalidInput(format!("tensor '{}': reading the file: {e}", self.name))
            })
        }
        #[cfg(not(unix))]
        {
            buf.copy_from_slice(&self.bytes()[offset..offset + buf.len()]);
            Ok(())
        }
    }

    /// Tells the OS that this process does not need the tensor's pages in
    /// memory any more (its bytes were copied, e.g. repacked for a kernel):
    /// they leave the resident set. [`TensorData::bytes`] stays valid and
    /// reads them back from the file if used again. A no-op where the OS
    /// has no such advice.
    pub fn release_pages(&self) {
        self.map.release(self.start, self.len);
    }

    /// [`TensorData::release_pages`] for the bytes `range` of the tensor
    /// (clamped to it), e.g. the part a repacking loop has copied so far.
    pub fn release_range(&self, range: std::ops::Range<usize>) {
        let end = range.end.min(self.len);
        if range.start < end {
            self.map
                .release(self.start + range.start, end - range.start);
        }
    }
}

/// Reads little-endian fields from the index, reporting truncation by entry.
struct IndexCursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl IndexCursor<'_> {
    fn take(&mut self, n: usize, what: &str, entry: usize) -> Result<&[u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| {
            Error::TruncatedIndex(format!(
                "entry {entry}: {what} needs {n} bytes at index byte {} but the index has {}",
                self.pos,
                self.bytes.len()
            ))
        })?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn i32(&mut self, what: &str, entry: usize) -> Result<i32> {
        let b = self.take(4, what, entry)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str, entry: usize) -> Result<u64> {
        let b = self.take(8, what, entry)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

/// Length of the fixed header: magic (i32) and index size (u64).
const HEADER_LEN: usize = 12;

impl MllmFile {
    /// Opens, maps and validates a `.mllm` file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let map = MappedFile::map(&file, path)?;
        let (entries, metadata) = parse(&map)?;
        Ok(MllmFile {
            path: path.to_path_buf(),
            file: Arc::new(file),
            map: Arc::new(map),
            entries,
            metadata,
        })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Total file size in bytes.
    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Every index entry (tensors and metadata entries), in file order.
    pub fn entries(&self) -> &IndexMap<String, IndexEntry> {
        &self.entries
    }

    /// The embedded metadata, when the file has it.
    pub fn metadata(&self) -> Option<&Metadata> {
        self.metadata.as_ref()
    }

    /// The embedded `tokenizer.json` text, when the file has it.
    pub fn tokenizer_json(&self) -> Result<Option<&str>> {
        self.text_entry(TOKENIZER_ENTRY)
    }

    /// The embedded chat template, when the file has it.
    pub fn chat_template(&self) -> Result<Option<&str>> {
        self.text_entry(CHAT_TEMPLATE_ENTRY)
    }

    /// Tells the OS that this process does not need the pages of the
    /// embedded metadata, tokenizer and chat template in memory any more,
    /// once what it needs from them has been parsed or copied (as
    /// [`TensorData::release_pages`] does for a tensor). A model keeps its
    /// file mapped for its weights, so otherwise the text read from the map
    /// stays resident beside its parsed form: 1.5 MiB for SmolLM2's
    /// tokenizer, about 9 MB for Llama 3's. Later reads fault the pages back
    /// in from the file.
    pub fn release_text_entries(&self) {
        for name in [META_ENTRY, TOKENIZER_ENTRY, CHAT_TEMPLATE_ENTRY] {
            if let Some(e) = self.entries.get(name) {
                self.map.release(e.offset as usize, e.len as usize);
            }
        }
    }

    /// The raw bytes of any entry (validated to lie inside the file).
    pub fn entry_bytes(&self, name: &str) -> Option<&[u8]> {
        let e = self.entries.get(name)?;
        Some(&self.map[e.offset as usize..(e.offset + e.len) as usize])
    }

    fn text_entry(&self, name: &str) -> Result<Option<&str>> {
        match self.entry_bytes(name) {
            None => Ok(None),
            Some(b) => std::str::from_utf8(b)
                .map(Some)
                .map_err(|e| Error::BadMetadata {
                    entry: name.to_string(),
                    detail: format!("not UTF-8: {e}"),
                }),
        }
    }

    /// The shape recorded in the metadata for a tensor, if any.
    pub fn recorded_shape(&self, name: &str) -> Option<&[usize]> {
        self.metadata
            .as_ref()
            .and_then(|m| m.tensors.get(name))
            .map(Vec::as_slice)
    }

    /// A tensor with the shape recorded in the metadata.
    ///
    /// Fails with [`Error::MissingTensor`] when the name is absent, and with
    /// [`Error::BadMetadata`] when the file has no shape for it (plain v1
    /// files: use [`MllmFile::tensor_with_shape`]).
    pub fn tensor(&self, name: &str) -> Result<TensorData> {
        let shape = self.recorded_shape(name).ok_or_else(|| {
            if self.entries.contains_key(name) {
                Error::BadMetadata {
                    entry: META_ENTRY.to_string(),
                    detail: format!("no shape recorded for tensor '{name}'"),
                }
            } else {
                Error::MissingTensor(name.to_string())
            }
        })?;
        self.tensor_with_shape(name, shape)
    }

    /// A tensor that must have `shape`: checks the recorded shape (if any)
    /// and that the byte length matches the shape and dtype.
    pub fn tensor_with_shape(&self, name: &str, shape: &[usize]) -> Result<TensorData> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        if let Some(recorded) = self.recorded_shape(name) {
            if recorded != shape {
                return Err(Error::shape(
                    format!("tensor '{name}'"),
                    format!("the file records shape {recorded:?}, the model expects {shape:?}"),
                ));
            }
        }
        check_size(name, entry, shape)?;
        Ok(TensorData {
            name: name.to_string(),
            dtype: entry.dtype,
            shape: Shape::new(shape.to_vec()),
            file: Arc::clone(&self.file),
            map: Arc::clone(&self.map),
            start: entry.offset as usize,
            len: entry.len as usize,
        })
    }
}

fn check_size(name: &str, entry: &IndexEntry, shape: &[usize]) -> Result<()> {
    let expected = crate::shape::checked_numel(shape).and_then(|n| entry.dtype.bytes_for(n).ok());
    if expected.map(|e| e as u64) != Some(entry.len) {
        return Err(Error::SizeMismatch {
            name: name.to_string(),
            shape: shape.to_vec(),
            dtype: entry.dtype.to_string(),
            len: entry.len,
            expected: expected.unwrap_or(0) as u64,
        });
    }
    Ok(())
}

type ParsedIndex = (IndexMap<String, IndexEntry>, Option<Metadata>);

fn parse(bytes: &[u8]) -> Result<ParsedIndex> {
    let file_len = bytes.len() as u64;
    if bytes.len() < 4 {
        return Err(Error::TruncatedIndex(format!(
            "file is {file_len} bytes, too short for the magic number"
        )));
    }
    let magic = i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if magic != MAGIC {
        return Err(Error::BadMagic {
            found: magic,
            expected: MAGIC,
        });
    }
    if bytes.len() < HEADER_LEN {
        return Err(Error::TruncatedIndex(format!(
            "file is {file_len} bytes, too short for the index size"
        )));
    }
    let mut size = [0u8; 8];
    size.copy_from_slice(&bytes[4..HEADER_LEN]);
    let index_size = u64::from_le_bytes(size);
    let index_end = (HEADER_LEN as u64)
        .checked_add(index_size)
        .filter(|&end| end <= file_len)
        .ok_or_else(|| {
            Error::TruncatedIndex(format!(
                "index of {index_size} bytes does not fit in a file of {file_len} bytes"
            ))
        })?;
    let mut cursor = IndexCursor {
        bytes: &bytes[HEADER_LEN..index_end as usize],
        pos: 0,
    };
    let mut entries = IndexMap::new();
    while cursor.pos < cursor.bytes.len() {
        let n = entries.len();
        let name_len = cursor.i32("name length", n)?;
        let name_len = usize::try_from(name_len).map_err(|_| {
            Error::CorruptIndex(format!("entry {n}: negative name length {name_len}"))
        })?;
        let name = std::str::from_utf8(cursor.take(name_len, "name", n)?)
            .map_err(|e| Error::CorruptIndex(format!("entry {n}: name is not UTF-8: {e}")))?
            .to_string();
        let len = cursor.u64("data length", n)?;
        let offset = cursor.u64("offset", n)?;
        let code = cursor.i32("dtype", n)?;
        let dtype = DType::from_code(code).ok_or_else(|| Error::UnknownDType {
            name: name.clone(),
            code,
        })?;
        if offset.checked_add(len).is_none_or(|end| end > file_len) {
            return Err(Error::TensorOutOfBounds {
                name,
                offset,
                len,
                file_len,
            });
        }
        if offset < index_end && len > 0 {
            return Err(Error::CorruptIndex(format!(
                "tensor '{name}': data at offset {offset} overlaps the header and index (which end at {index_end})"
            )));
        }
        if entries
            .insert(name.clone(), IndexEntry { dtype, offset, len })
            .is_some()
        {
            return Err(Error::CorruptIndex(format!("duplicate entry '{name}'")));
        }
    }
    let metadata = match entries.get(META_ENTRY) {
        None => None,
        Some(e) => {
            let raw = &bytes[e.offset as usize..(e.offset + e.len) as usize];
            let meta = Metadata::from_json_bytes(META_ENTRY, raw)?;
            for (name, shape) in &meta.tensors {
                let entry = entries.get(name).ok_or_else(|| Error::BadMetadata {
                    entry: META_ENTRY.to_string(),
                    detail: format!("lists tensor '{name}' that is not in the index"),
                })?;
                check_size(name, entry, shape)?;
            }
            Some(meta)
        }
    };
    Ok((entries, metadata))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::MllmWriter;

    /// The resident kilobytes (`/proc/self/smaps`) of this process's
    /// mapping that holds `addr`.
    #[cfg(target_os = "linux")]
    fn resident_kib_of_mapping(addr: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let mut holds_addr = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or_default();
            let bounds = first.split_once('-').and_then(|(a, b)| {
                Some((
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                ))
            });
            if let Some((start, end)) = bounds {
                holds_addr = start <= addr && addr < end;
            } else if let (true, Some(kib)) = (holds_addr, line.strip_prefix("Rss:")) {
                let kib = kib.trim().trim_end_matches("kB").trim();
                return kib.parse().expect("Rss in kB");
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    /// A file whose 2 MiB tokenizer has been read (every page of it
    /// faulted in) drops those pages from the resident set when its text
    /// entries are released, and still reads the same text afterwards.
    #[cfg(target_os = "linux")]
    #[cfg_attr(miri, ignore)]
    #[test]
    fn released_text_entries_leave_the_resident_set_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("text.mllm");
        let tokenizer = format!("{{\"vocab\":\"{}\"}}", "ab".repeat(1 << 20));
        let mut writer = MllmWriter::new();
        writer
            .tokenizer_json(tokenizer.clone())
            .chat_template("{{ messages }}");
        writer
            .write(&path, |_, _| unreachable!("the file has no tensors"))
            .unwrap();
        let file = MllmFile::open(&path).unwrap();
        let text = file.tokenizer_json().unwrap().unwrap();
        assert_eq!(text, tokenizer);
        let addr = text.as_ptr() as usize;
        let before = resident_kib_of_mapping(addr);
        file.release_text_entries();
        let after = resident_kib_of_mapping(addr);
        assert!(
            after + 2000 <= before,
            "resident {before} KiB before the release, {after} KiB after"
        );
        assert_eq!(file.tokenizer_json().unwrap(), Some(tokenizer.as_str()));
        assert_eq!(file.chat_template().unwrap(), Some("{{ messages }}"));
    }
}
