//! Corrupt and mismatched `.mllm` files each give a distinct, named error.

mod common;

use common::*;
use mllm::core::file::{MllmFile, MllmWriter, TensorSpec, META_ENTRY};
use mllm::core::{DType, Error};
use mllm::models::{LoadOptions, Model};

/// Byte positions of one index entry's fields.
struct EntryPos {
    name: String,
    len_at: usize,
    offset_at: usize,
    dtype_at: usize,
}

fn index_positions(bytes: &[u8]) -> Vec<EntryPos> {
    let index_size = u64::from_le_bytes(bytes[4..12].try_into().unwrap()) as usize;
    let mut pos = 12;
    let mut out = Vec::new();
    while pos < 12 + index_size {
        let n = i32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        let name = String::from_utf8(bytes[pos + 4..pos + 4 + n].to_vec()).unwrap();
        let len_at = pos + 4 + n;
        out.push(EntryPos {
            name,
            len_at,
            offset_at: len_at + 8,
            dtype_at: len_at + 16,
        });
        pos = len_at + 20;
    }
    out
}

fn entry<'a>(entries: &'a [EntryPos], name: &str) -> &'a EntryPos {
    entries.iter().find(|e| e.name == name).unwrap()
}

/// Writes `bytes` to a temp file and opens it.
fn open_bytes(bytes: &[u8]) -> Result<MllmFile, Error> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.mllm");
    std::fs::write(&path, bytes).unwrap();
    MllmFile::open(&path)
}

fn good_file() -> (Converted, Vec<u8>) {
    let c = convert_to(&fixture("tiny-llama"), DType::F32);
    let bytes = std::fs::read(&c.path).unwrap();
    (c, bytes)
}

#[test]
fn wrong_magic() {
    let (_c, mut bytes) = good_file();
    bytes[..4].copy_from_slice(&1234i32.to_le_bytes());
    match open_bytes(&bytes) {
        Err(Error::BadMagic {
            found: 1234,
            expected: 20012,
        }) => {}
        other => panic!("expected BadMagic, got {other:?}"),
    }
}

#[test]
fn truncated_index() {
    let (_c, bytes) = good_file();
    for cut in [2, 10, 40] {
        match open_bytes(&bytes[..cut]) {
            Err(Error::TruncatedIndex(_)) => {}
            other => panic!("cut at {cut}: expected TruncatedIndex, got {other:?}"),
        }
    }
    // An index size larger than the file.
    let mut big = bytes.clone();
    big[4..12].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
    assert!(matches!(open_bytes(&big), Err(Error::TruncatedIndex(_))));
}

#[test]
fn offset_or_length_past_end_of_file() {
    let (_c, bytes) = good_file();
    let entries = index_positions(&bytes);
    let e = entry(&entries, "model.norm.weight");
    let file_len = bytes.len() as u64;

    let mut past_offset = bytes.clone();
    past_offset[e.offset_at..e.offset_at + 8].copy_from_slice(&(file_len - 8).to_le_bytes());
    match open_bytes(&past_offset) {
        Err(Error::TensorOutOfBounds { name, .. }) => assert_eq!(name, "model.norm.weight"),
        other => panic!("expected TensorOutOfBounds, got {other:?}"),
    }

    let mut past_len = bytes.clone();
    past_len[e.len_at..e.len_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    match open_bytes(&past_len) {
        Err(Error::TensorOutOfBounds { name, len, .. }) => {
            assert_eq!(name, "model.norm.weight");
            assert_eq!(len, u64::MAX);
        }
        other => panic!("expected TensorOutOfBounds, got {other:?}"),
    }
}

#[test]
fn unknown_dtype() {
    let (_c, mut bytes) = good_file();
    let entries = index_positions(&bytes);
    let e = entry(&entries, "lm_head.weight");
    bytes[e.dtype_at..e.dtype_at + 4].copy_from_slice(&77i32.to_le_bytes());
    match open_bytes(&bytes) {
        Err(Error::UnknownDType { name, code: 77 }) => assert_eq!(name, "lm_head.weight"),
        other => panic!("expected UnknownDType, got {other:?}"),
    }
}

#[test]
fn size_not_matching_shape() {
    let (_c, bytes) = good_file();
    let needle = br#""model.norm.weight":[64]"#;
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap();
    let mut patched = bytes.clone();
    patched[at..at + needle.len()].copy_from_slice(br#""model.norm.weight":[65]"#);
    match open_bytes(&patched) {
        Err(Error::SizeMismatch {
            name, shape, len, ..
        }) => {
            assert_eq!(name, "model.norm.weight");
            assert_eq!(shape, vec![65]);
            assert_eq!(len, 256);
        }
        other => panic!("expected SizeMismatch, got {other:?}"),
    }
}

#[test]
fn malformed_metadata_json() {
    let (_c, mut bytes) = good_file();
    let file = open_bytes(&bytes).unwrap();
    let meta_offset = file.entries()[META_ENTRY].offset as usize;
    bytes[meta_offset] = b'#';
    match open_bytes(&bytes) {
        Err(Error::BadMetadata { entry, .. }) => assert_eq!(entry, META_ENTRY),
        other => panic!("expected BadMetadata, got {other:?}"),
    }
}

/// How [`rewrite`] changes a file besides leaving out a tensor.
#[derive(Clone, Copy)]
enum Header<'a> {
    /// Keep the metadata.
    Keep,
    /// Drop the metadata (a plain mllm v1 file).
    Plain,
    /// Keep the metadata and embed this chat template.
    WithTemplate(&'a str),
}

/// Rewrites a converted file, leaving out `skip` and changing its header.
fn rewrite(src: &std::path::Path, dst: &std::path::Path, skip: &str, header: Header<'_>) {
    let file = MllmFile::open(src).unwrap();
    let mut w = MllmWriter::new();
    match header {
        Header::Keep => {
            w.metadata(file.metadata().unwrap().clone());
        }
        Header::Plain => {}
        Header::WithTemplate(t) => {
            w.metadata(file.metadata().unwrap().clone());
            w.chat_template(t);
        }
    }
    let names: Vec<String> = file
        .metadata()
        .unwrap()
        .tensors
        .keys()
        .filter(|n| n.as_str() != skip)
        .cloned()
        .collect();
    for n in &names {
        let t = file.tensor(n).unwrap();
        w.add_tensor(TensorSpec::new(
            n.clone(),
            t.dtype(),
            t.shape().dims().to_vec(),
        ))
        .unwrap();
    }
    w.write(dst, |_, spec| {
        Ok(file.tensor(&spec.name)?.bytes().to_vec().into())
    })
    .unwrap();
}

#[test]
fn missing_tensor() {
    let (c, _) = good_file();
    let dst = c.dir.path().join("missing.mllm");
    rewrite(
        &c.path,
        &dst,
        "model.layers.1.mlp.up_proj.weight",
        Header::Keep,
    );
    match Model::load(&dst, &LoadOptions::default()) {
        Err(Error::MissingTensor(name)) => assert_eq!(name, "model.layers.1.mlp.up_proj.weight"),
        Err(other) => panic!("expected MissingTensor, got {other:?}"),
        Ok(_) => panic!("expected MissingTensor, got a model"),
    }
}

/// A plain mllm v1 file (no metadata) loads when the config is given, and
/// says what is missing when it is not.
#[test]
fn plain_v1_file_needs_config() {
    let (c, _) = good_file();
    let dst = c.dir.path().join("plain.mllm");
    rewrite(&c.path, &dst, "", Header::Plain);
    let plain = MllmFile::open(&dst).unwrap();
    assert!(plain.metadata().is_none());
    match Model::load(&dst, &LoadOptions::default()) {
        Err(Error::Config(msg)) => assert!(msg.contains("config.json"), "{msg}"),
        Err(other) => panic!("expected Config, got {other:?}"),
        Ok(_) => panic!("a file without metadata or config must not load"),
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("tiny-llama/config.json")).unwrap()).unwrap();
    let opts = LoadOptions {
        config: Some(config),
        threads: 2,
        ..Default::default()
    };
    let mut plain_model = Model::load(&dst, &opts).unwrap();
    let mut full_model = load(&c.path);
    let ids = Reference::load("tiny-llama").ids("/inputs/short");
    let step = |m: &mut Model| {
        m.step(&mllm::core::StepInput::single(
            0,
            ids.clone(),
            mllm::core::LogitsMode::All,
        ))
        .unwrap()
    };
    assert_eq!(step(&mut plain_model), step(&mut full_model));
}

/// A config whose layer count the file's tensors cannot back (each layer
/// needs at least one) is refused before the model is built: a hostile
/// count of 10^12 would otherwise allocate 10^12 layers.
#[test]
fn a_layer_count_beyond_the_tensors_is_refused() {
    let (c, _) = good_file();
    let dst = c.dir.path().join("plain.mllm");
    rewrite(&c.path, &dst, "", Header::Plain);
    let tensors = MllmFile::open(&dst).unwrap().entries().len();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("tiny-llama/config.json")).unwrap()).unwrap();
    config["num_hidden_layers"] = serde_json::json!(1_000_000_000_000u64);
    let opts = LoadOptions {
        config: Some(config),
        ..Default::default()
    };
    match Model::load(&dst, &opts) {
        Err(Error::Config(msg)) => assert_eq!(
            msg,
            format!(
                "config 'num_hidden_layers' is 1000000000000, but the weights hold only {tensors} tensors"
            )
        ),
        Err(other) => panic!("expected Config, got {other:?}"),
        Ok(_) => panic!("must be refused"),
    }
}

/// A plain file whose tensor has the wrong byte size for the model's shape.
#[test]
fn plain_v1_size_mismatch_against_model_shape() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.mllm");
    let mut w = MllmWriter::new();
    w.add_tensor(TensorSpec::new(
        "model.embed_tokens.weight",
        DType::F32,
        vec![10],
    ))
    .unwrap();
    w.write(&path, |_, _| Ok(vec![0u8; 40].into())).unwrap();
    let file = MllmFile::open(&path).unwrap();
    match file.tensor_with_shape("model.embed_tokens.weight", &[256, 64]) {
        Err(Error::SizeMismatch { expected, len, .. }) => {
            assert_eq!(expected, 256 * 64 * 4);
            assert_eq!(len, 40);
        }
        other => panic!("expected SizeMismatch, got {other:?}"),
    }
}

#[test]
fn file_round_trips_byte_exactly() {
    let (c, bytes) = good_file();
    let file = MllmFile::open(&c.path).unwrap();
    let dst = c.dir.path().join("copy.mllm");
    let mut w = MllmWriter::new();
    w.metadata(file.metadata().unwrap().clone());
    if let Some(t) = file.tokenizer_json().unwrap() {
        w.tokenizer_json(t);
    }
    if let Some(t) = file.chat_template().unwrap() {
        w.chat_template(t);
    }
    for (name, shape) in &file.metadata().unwrap().tensors {
        let dtype = file.entries()[name].dtype;
        w.add_tensor(TensorSpec::new(name.clone(), dtype, shape.clone()))
            .unwrap();
    }
    w.write(&dst, |_, spec| {
        Ok(file.tensor(&spec.name)?.bytes().to_vec().into())
    })
    .unwrap();
    assert_eq!(std::fs::read(&dst).unwrap(), bytes);
    // Every tensor offset is 64-byte aligned.
    for (name, e) in file.entries() {
        assert_eq!(e.offset % 64, 0, "{name}");
    }
}

#[test]
fn failed_write_leaves_no_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.mllm");
    let mut w = MllmWriter::new();
    w.add_tensor(TensorSpec::new("a", DType::F32, vec![4]))
        .unwrap();
    let err = w.write(&path, |_, _| Ok(vec![0u8; 3].into())).unwrap_err();
    assert!(matches!(err, Error::SizeMismatch { .. }), "{err:?}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Released pages read back from the file: every tensor keeps its bytes
/// after `release_range` and `release_pages` (the packed linear layers
/// release their mapped
/// copies at load; a tied embedding may still read them).
#[test]
fn released_tensor_pages_read_back_unchanged() {
    let (c, bytes) = good_file();
    let file = MllmFile::open(&c.path).unwrap();
    for (name, _) in &file.metadata().unwrap().tensors {
        let e = &file.entries()[name];
        let t = file.tensor(name).unwrap();
        let before = t.bytes().to_vec();
        t.release_range(1..before.len() / 2);
        assert_eq!(t.bytes(), &before[..], "{name}: after releasing part");
        t.release_range(before.len() / 2..usize::MAX);
        t.release_pages();
        assert_eq!(t.bytes(), &before[..], "{name}");
        let (start, len) = (e.offset as usize, before.len());
        assert_eq!(&bytes[start..start + len], t.bytes(), "{name}");
    }
}

/// A chat template given for a file that embeds a different one is
/// refused; the same one, or one for a file without any, is taken.
#[test]
fn given_chat_template_must_agree_with_the_embedded_one() {
    let (c, _) = good_file();
    let dst = c.dir.path().join("templated.mllm");
    rewrite(&c.path, &dst, "", Header::WithTemplate("{{ messages }}"));
    let with_template = |t: &str| LoadOptions {
        chat_template: Some(t.to_string()),
        ..Default::default()
    };
    match Model::load(&dst, &with_template("{{ other }}")) {
        Err(Error::Config(msg)) => assert!(
            msg.contains("the given chat template differs from the one embedded"),
            "{msg}"
        ),
        Err(other) => panic!("expected Config, got {other:?}"),
        Ok(_) => panic!("a contradicting chat template must be refused"),
    }
    let same = Model::load(&dst, &with_template("{{ messages }}")).unwrap();
    assert_eq!(same.chat_template(), Some("{{ messages }}"));
    let given = Model::load(&c.path, &with_template("{{ given }}")).unwrap();
    assert_eq!(given.chat_template(), Some("{{ given }}"));
}

/// Positioned reads of a tensor's bytes equal its mapped bytes; a range
/// past the tensor is an error naming it.
#[test]
fn positioned_reads_equal_the_mapped_bytes() {
    let (c, _) = good_file();
    let file = MllmFile::open(&c.path).unwrap();
    let t = file.tensor("model.embed_tokens.weight").unwrap();
    let bytes = t.bytes();
    for (offset, len) in [(0, 16), (bytes.len() - 7, 7), (1000, 256)] {
        let mut buf = vec![0u8; len];
        t.read_at(offset, &mut buf).unwrap();
        assert_eq!(buf, &bytes[offset..offset + len]);
    }
    let mut buf = vec![0u8; 8];
    let err = t
        .read_at(bytes.len() - 4, &mut buf)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.embed_tokens.weight") && err.contains("outside"),
        "{err}"
    );
}
