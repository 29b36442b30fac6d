//! Where ops find their weights.

use std::cell::RefCell;

use indexmap::IndexMap;

use crate::file::{is_metadata_entry, MllmFile, TensorData};
use crate::{Error, Result};

/// A source of named weights, checked against the shape the model expects.
///
/// [`MllmFile`] is the usual source; tests and examples may provide their own.
pub trait WeightSource {
    /// The weight `name`, which must have `shape`; fails with a named error
    /// when it is missing or its size does not match.
    fn weight(&self, name: &str, shape: &[usize]) -> Result<TensorData>;
}

impl WeightSource for MllmFile {
    fn weight(&self, name: &str, shape: &[usize]) -> Result<TensorData> {
        self.tensor_with_shape(name, shape)
    }
}

/// A file as a weight source that remembers the shape each weight was
/// read with, so that after a model is built from it the weights it never
/// read can be found: a file with more layers than its config, or tensors
/// of another model, is refused instead of silently running on a part of
/// it.
pub struct TrackedWeights<'f> {
    file: &'f MllmFile,
    read: RefCell<IndexMap<String, Vec<usize>>>,
}

impl<'f> TrackedWeights<'f> {
    /// Tracks the reads of `file`.
    pub fn new(file: &'f MllmFile) -> Self {
        TrackedWeights {
            file,
            read: RefCell::new(IndexMap::new()),
        }
    }

    /// Every weight read so far, with the shape it was read with, in the
    /// order of the reads.
    pub fn into_shapes(self) -> IndexMap<String, Vec<usize>> {
        self.read.into_inner()
    }

    /// The file's tensors (not its metadata entries) that nothing read.
    pub fn unread(&self) -> Vec<&'f str> {
        let read = self.read.borrow();
        self.file
            .entries()
            .keys()
            .filter(|name| !is_metadata_entry(name) && !read.contains_key(name.as_str()))
            .map(String::as_str)
            .collect()
    }

    /// Fails, naming up to three of them, when some tensor of the file was
    /// not read by the `architecture` model built from it.
    pub fn check_all_read(&self, architecture: &str) -> Result<()> {
        let unread = self.unread();
        if unread.is_empty() {
            return Ok(());
        }
        let shown: Vec<String> = unread.iter().take(3).map(|n| format!("'{n}'")).collect();
        let more = match unread.len() {
            n if n > 3 => format!(" and {} more", n - 3),
            _ => String::new(),
        };
        Err(Error::Config(format!(
            "the file holds {} tensor(s) that the {architecture} model its config describes does not use: {}{more} (more layers than the config's, or weights of another model)",
            unread.len(),
            shown.join(", ")
        )))
    }
}

impl WeightSource for TrackedWeights<'_> {
    fn weight(&self, name: &str, shape: &[usize]) -> Result<TensorData> {
        let data = self.file.tensor_with_shape(name, shape)?;
        self.read
            .borrow_mut()
            .insert(name.to_string(), shape.to_vec());
        Ok(data)
    }
}
