//! GGUF import on synthetic files written by a small writer in this test:
//! the reader (every value type, v2 and v3, alignment, every error path), the
//! type mapping, the q/k row order, config synthesis, tokenizer and CLI.

use std::path::{Path, PathBuf};
use std::process::Command;

use mllm_convert::gguf::{self, GgufArray, GgufFile, GgufValue};
use mllm_convert::{convert, inspect, ConvertOptions};
use mllm_core::file::MllmFile;
use mllm_core::{DType, Error, LogitsMode, StepInput};
use mllm_models::tokenizer::Tokenizer;
use serde_json::json;

// ---------------------------------------------------------------- the writer

const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

// ggml tensor types
const G_F32: u32 = 0;
const G_F16: u32 = 1;
const G_Q4_0: u32 = 2;
const G_Q4_1: u32 = 3;
const G_Q5_0: u32 = 6;
const G_Q5_1: u32 = 7;
const G_Q8_0: u32 = 8;
const G_Q2_K: u32 = 10;
const G_Q3_K: u32 = 11;
const G_Q4_K: u32 = 12;
const G_Q5_K: u32 = 13;
const G_Q6_K: u32 = 14;
const G_IQ2_XXS: u32 = 16;
const G_IQ4_NL: u32 = 20;
const G_IQ4_XS: u32 = 23;
const G_BF16: u32 = 30;

fn gstr(s: &str) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(s.as_bytes());
    out
}

struct Tensor {
    name: String,
    ne: Vec<u64>,
    ty: u32,
    data: Vec<u8>,
}

/// Builds GGUF bytes: header, metadata, tensor infos, aligned data.
struct Gguf {
    version: u32,
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<Tensor>,
    alignment: usize,
}

impl Gguf {
    fn new(version: u32) -> Self {
        Gguf {
            version,
            kv: Vec::new(),
            n_kv: 0,
            tensors: Vec::new(),
            alignment: 32,
        }
    }

    /// A metadata entry with a raw payload after the type code.
    fn raw(&mut self, key: &str, ty: u32, payload: &[u8]) -> &mut Self {
        self.kv.extend(gstr(key));
        self.kv.extend(ty.to_le_bytes());
        self.kv.extend_from_slice(payload);
        self.n_kv += 1;
        self
    }

    fn u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.raw(key, T_U32, &v.to_le_bytes())
    }

    fn f32(&mut self, key: &str, v: f32) -> &mut Self {
        self.raw(key, T_F32, &v.to_le_bytes())
    }

    fn bool(&mut self, key: &str, v: bool) -> &mut Self {
        self.raw(key, T_BOOL, &[v as u8])
    }

    fn string(&mut self, key: &str, v: &str) -> &mut Self {
        self.raw(key, T_STRING, &gstr(v))
    }

    fn strings(&mut self, key: &str, v: &[&str]) -> &mut Self {
        let mut p = T_STRING.to_le_bytes().to_vec();
        p.extend((v.len() as u64).to_le_bytes());
        for s in v {
            p.extend(gstr(s));
        }
        self.raw(key, T_ARRAY, &p)
    }

    fn i32s(&mut self, key: &str, v: &[i32]) -> &mut Self {
        let mut p = T_I32.to_le_bytes().to_vec();
        p.extend((v.len() as u64).to_le_bytes());
        for x in v {
            p.extend(x.to_le_bytes());
        }
        self.raw(key, T_ARRAY, &p)
    }

    fn f32s(&mut self, key: &str, v: &[f32]) -> &mut Self {
        let mut p = T_F32.to_le_bytes().to_vec();
        p.extend((v.len() as u64).to_le_bytes());
        for x in v {
            p.extend(x.to_le_bytes());
        }
        self.raw(key, T_ARRAY, &p)
    }

    fn alignment(&mut self, a: u32) -> &mut Self {
        self.alignment = a as usize;
        self.u32("general.alignment", a)
    }

    fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, data: Vec<u8>) -> &mut Self {
        self.tensors.push(Tensor {
            name: name.to_string(),
            ne: ne.to_vec(),
            ty,
            data,
        });
        self
    }

    /// Position of the first tensor info (the end of the metadata).
    fn infos_start(&self) -> usize {
        24 + self.kv.len()
    }

    fn bytes(&self) -> Vec<u8> {
        let a = self.alignment;
        let mut offsets = Vec::new();
        let mut off = 0usize;
        for t in &self.tensors {
            offsets.push(off);
            off = (off + t.data.len()).div_ceil(a) * a;
        }
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kv);
        for (t, off) in self.tensors.iter().zip(&offsets) {
            out.extend(gstr(&t.name));
            out.extend((t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            out.extend((*off as u64).to_le_bytes());
        }
        out.resize(out.len().div_ceil(a) * a, 0);
        let start = out.len();
        for (t, off) in self.tensors.iter().zip(&offsets) {
            out.resize(start + off, 0);
            out.extend_from_slice(&t.data);
        }
        out
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn open_bytes(bytes: &[u8]) -> mllm_core::Result<GgufFile> {
    let dir = tempfile::tempdir().unwrap();
    GgufFile::open(write(dir.path(), "x.gguf", bytes))
}

fn bad_gguf(bytes: &[u8]) -> String {
    match open_bytes(bytes) {
        Err(Error::BadGguf(msg)) => msg,
        Err(other) => panic!("expected BadGguf, got {other:?}"),
        Ok(_) => panic!("expected an error"),
    }
}

fn f32_bytes(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(f32::to_le_bytes).collect()
}

// ------------------------------------------------------- a tiny Llama model

const HIDDEN: u64 = 32;
const HEADS: u64 = 4;
const KV_HEADS: u64 = 2;
const HEAD_DIM: u64 = 8;
const FFN: u64 = 64;
const TOKENS: [&str; 8] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "a",
    "b",
    "ab",
    "Ġ",
    "Ġab",
];
const TEMPLATE: &str =
    "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}";

/// Row `r` of an F32 matrix with `cols` columns holds `r * 1000 + c` at column `c`.
fn rows_f32(rows: u64, cols: u64) -> Vec<u8> {
    f32_bytes((0..rows).flat_map(|r| (0..cols).map(move |c| (r * 1000 + c) as f32)))
}

/// Options of the tiny model.
struct Tiny {
    version: u32,
    untied: bool,
    eps: f32,
    rope_base: Option<f32>,
    q_type: u32,
    /// `llama.block_count` (the tensors are always those of one layer).
    block_count: u32,
}

impl Default for Tiny {
    fn default() -> Self {
        Tiny {
            version: 3,
            untied: false,
            eps: 1e-5,
            rope_base: None,
            q_type: G_F32,
            block_count: 1,
        }
    }
}

/// The metadata and tensors of a one-layer Llama with a tiny byte-level BPE.
fn tiny_llama(opts: &Tiny) -> Gguf {
    let mut g = Gguf::new(opts.version);
    g.string("general.architecture", "llama")
        .string("general.name", "tiny")
        .u32("llama.block_count", opts.block_count)
        .u32("llama.context_length", 128)
        .u32("llama.embedding_length", HIDDEN as u32)
        .u32("llama.feed_forward_length", FFN as u32)
        .u32("llama.attention.head_count", HEADS as u32)
        .u32("llama.attention.head_count_kv", KV_HEADS as u32)
        .f32("llama.attention.layer_norm_rms_epsilon", opts.eps)
        .u32("llama.rope.dimension_count", HEAD_DIM as u32);
    if let Some(base) = opts.rope_base {
        g.f32("llama.rope.freq_base", base);
    }
    g.string("tokenizer.ggml.model", "gpt2")
        .string("tokenizer.ggml.pre", "smollm")
        .strings("tokenizer.ggml.tokens", &TOKENS)
        .i32s("tokenizer.ggml.token_type", &[3, 3, 3, 1, 1, 1, 1, 1])
        .strings("tokenizer.ggml.merges", &["a b", "Ġ ab"])
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 2)
        .u32("tokenizer.ggml.unknown_token_id", 0)
        .u32("tokenizer.ggml.padding_token_id", 2)
        .bool("tokenizer.ggml.add_bos_token", false)
        .string("tokenizer.chat_template", TEMPLATE);
    let vocab = TOKENS.len() as u64;
    let q_rows = HEADS * HEAD_DIM;
    let kv_rows = KV_HEADS * HEAD_DIM;
    let q_data = match opts.q_type {
        G_F32 => rows_f32(q_rows, HIDDEN),
        // One Q4_1 block (20 bytes) per row of 32: every byte is the row index.
        G_Q4_1 => (0..q_rows).flat_map(|r| [r as u8; 20]).collect(),
        other => panic!("no test data for type {other}"),
    };
    g.tensor(
        "token_embd.weight",
        &[HIDDEN, vocab],
        G_F32,
        rows_f32(vocab, HIDDEN),
    )
    .tensor(
        "blk.0.attn_norm.weight",
        &[HIDDEN],
        G_F32,
        rows_f32(1, HIDDEN),
    )
    .tensor(
        "blk.0.attn_q.weight",
        &[HIDDEN, q_rows],
        opts.q_type,
        q_data,
    )
    .tensor(
        "blk.0.attn_k.weight",
        &[HIDDEN, kv_rows],
        G_F32,
        rows_f32(kv_rows, HIDDEN),
    )
    .tensor(
        "blk.0.attn_v.weight",
        &[HIDDEN, kv_rows],
        G_F32,
        rows_f32(kv_rows, HIDDEN),
    )
    .tensor(
        "blk.0.attn_output.weight",
        &[q_rows, HIDDEN],
        G_F32,
        rows_f32(HIDDEN, q_rows),
    )
    .tensor(
        "blk.0.ffn_norm.weight",
        &[HIDDEN],
        G_F32,
        rows_f32(1, HIDDEN),
    )
    .tensor(
        "blk.0.ffn_gate.weight",
        &[HIDDEN, FFN],
        G_F32,
        rows_f32(FFN, HIDDEN),
    )
    .tensor(
        "blk.0.ffn_up.weight",
        &[HIDDEN, FFN],
        G_F32,
        rows_f32(FFN, HIDDEN),
    )
    .tensor(
        "blk.0.ffn_down.weight",
        &[FFN, HIDDEN],
        G_F32,
        rows_f32(HIDDEN, FFN),
    )
    .tensor("output_norm.weight", &[HIDDEN], G_F32, rows_f32(1, HIDDEN));
    if opts.untied {
        g.tensor(
            "output.weight",
            &[HIDDEN, vocab],
            G_F32,
            rows_f32(vocab, HIDDEN),
        );
    }
    g
}

fn import(g: &Gguf) -> mllm_core::Result<(tempfile::TempDir, PathBuf)> {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "model.gguf", &g.bytes());
    let output = dir.path().join("model.mllm");
    convert(&input, &output, &ConvertOptions::default())?;
    Ok((dir, output))
}

fn import_ok(g: &Gguf) -> (tempfile::TempDir, MllmFile) {
    let (dir, out) = import(g).unwrap();
    let file = MllmFile::open(&out).unwrap();
    (dir, file)
}

fn import_err(g: &Gguf) -> Error {
    match import(g) {
        Err(e) => e,
        Ok(_) => panic!("expected the import to fail"),
    }
}

/// The rows of an F32 matrix as their first element divided by 1000 (the
/// source row index written by [`rows_f32`]).
fn row_ids(bytes: &[u8], cols: usize) -> Vec<u64> {
    bytes
        .chunks_exact(cols * 4)
        .map(|row| (f32::from_le_bytes(row[..4].try_into().unwrap()) / 1000.0) as u64)
        .collect()
}

// ------------------------------------------------------------------ reading

#[test]
fn reads_every_value_type_in_v2_and_v3() {
    for version in [2, 3] {
        let mut g = Gguf::new(version);
        g.raw("u8", T_U8, &[200])
            .raw("i8", T_I8, &(-5i8).to_le_bytes())
            .raw("u16", T_U16, &60000u16.to_le_bytes())
            .raw("i16", T_I16, &(-300i16).to_le_bytes())
            .u32("u32", 4_000_000_000)
            .raw("i32", T_I32, &(-70000i32).to_le_bytes())
            .f32("f32", 0.1)
            .bool("bool", true)
            .string("string", "héllo")
            .raw("u64", T_U64, &u64::MAX.to_le_bytes())
            .raw("i64", T_I64, &i64::MIN.to_le_bytes())
            .raw("f64", T_F64, &2.5f64.to_le_bytes())
            .strings("strings", &["x", "", "yz"])
            .i32s("ints", &[1, -2, 3]);
        // An array of two arrays of u8.
        let mut nested = T_ARRAY.to_le_bytes().to_vec();
        nested.extend(2u64.to_le_bytes());
        for items in [&[1u8, 2][..], &[3u8][..]] {
            nested.extend(T_U8.to_le_bytes());
            nested.extend((items.len() as u64).to_le_bytes());
            nested.extend_from_slice(items);
        }
        g.raw("nested", T_ARRAY, &nested);
        let f = open_bytes(&g.bytes()).unwrap();
        assert_eq!(f.version(), version);
        let m = f.metadata();
        assert_eq!(m.len(), 15);
        assert_eq!(m["u8"], GgufValue::U8(200));
        assert_eq!(m["i8"], GgufValue::I8(-5));
        assert_eq!(m["u16"], GgufValue::U16(60000));
        assert_eq!(m["i16"], GgufValue::I16(-300));
        assert_eq!(m["u32"], GgufValue::U32(4_000_000_000));
        assert_eq!(m["i32"], GgufValue::I32(-70000));
        assert_eq!(m["f32"], GgufValue::F32(0.1));
        assert_eq!(m["bool"], GgufValue::Bool(true));
        assert_eq!(m["string"], GgufValue::String("héllo".into()));
        assert_eq!(m["u64"], GgufValue::U64(u64::MAX));
        assert_eq!(m["i64"], GgufValue::I64(i64::MIN));
        assert_eq!(m["f64"], GgufValue::F64(2.5));
        assert_eq!(
            m["strings"],
            GgufValue::Array(GgufArray::String(vec!["x".into(), "".into(), "yz".into()]))
        );
        assert_eq!(f.opt_ints("ints").unwrap(), Some(vec![1, -2, 3]));
        assert_eq!(
            m["nested"],
            GgufValue::Array(GgufArray::Array(vec![
                GgufArray::U8(vec![1, 2]),
                GgufArray::U8(vec![3])
            ]))
        );
        // Typed getters: integers of any width, f32 widened exactly.
        assert_eq!(f.opt_u64("u16").unwrap(), Some(60000));
        assert_eq!(f.opt_f64("f32").unwrap(), Some(f64::from(0.1f32)));
        let err = f.opt_u64("i8").unwrap_err().to_string();
        assert!(
            err.contains("'i8' must be a non-negative integer, found i8"),
            "{err}"
        );
        let err = f.opt_strings("ints").unwrap_err().to_string();
        assert!(
            err.contains("must be an array of string, found array of i32"),
            "{err}"
        );
        assert!(f.tensors().is_empty());
    }
}

#[test]
fn tensor_data_is_found_with_default_and_custom_alignment() {
    for align in [None, Some(64u32), Some(8)] {
        let mut g = Gguf::new(3);
        g.string("general.name", "abc");
        if let Some(a) = align {
            g.alignment(a);
        }
        g.tensor("a", &[3], G_F32, f32_bytes([1.0, 2.0, 3.0]))
            .tensor("b", &[2, 2], G_F16, vec![1, 2, 3, 4, 5, 6, 7, 8]);
        let bytes = g.bytes();
        let f = open_bytes(&bytes).unwrap();
        let a = u64::from(align.unwrap_or(32));
        assert_eq!(f.alignment(), a);
        assert_eq!(f.data_start() % a, 0);
        assert!(f.data_start() >= g.infos_start() as u64);
        let t = f.tensor("a").unwrap();
        assert_eq!((t.dtype, t.shape.clone()), (DType::F32, vec![3]));
        assert_eq!(t.data, &f32_bytes([1.0, 2.0, 3.0])[..]);
        let t = f.tensor("b").unwrap();
        assert_eq!((t.dtype, t.shape.clone()), (DType::F16, vec![2, 2]));
        assert_eq!(t.data, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(t.row_bytes, 4);
        assert!(matches!(f.tensor("c"), Err(Error::MissingTensor(n)) if n == "c"));
    }
}

#[test]
fn kept_types_map_to_mllm_dtypes_and_others_are_named_errors() {
    // (ggml type, mllm dtype, bytes of a 256 x 2 tensor)
    let kept = [
        (G_F32, DType::F32, 2048),
        (G_F16, DType::F16, 1024),
        (G_BF16, DType::BF16, 1024),
        (G_Q4_0, DType::Q4_0, 16 * 18),
        (G_Q4_1, DType::Q4_1, 16 * 20),
        (G_Q8_0, DType::Q8_0, 16 * 34),
        (G_Q5_0, DType::Q5_0, 16 * 22),
        (G_Q5_1, DType::Q5_1, 16 * 24),
        (G_Q4_K, DType::Q4K, 2 * 144),
        (G_Q5_K, DType::Q5K, 2 * 176),
        (G_Q6_K, DType::Q6K, 2 * 210),
        (G_Q2_K, DType::Q2K, 2 * 84),
        (G_Q3_K, DType::Q3K, 2 * 110),
        (G_IQ4_NL, DType::IQ4NL, 16 * 18),
        (G_IQ4_XS, DType::IQ4XS, 2 * 136),
    ];
    let mut g = Gguf::new(3);
    for (ty, _, len) in kept {
        g.tensor(&format!("t{ty}"), &[256, 2], ty, vec![7; len]);
    }
    g.tensor("blk.3.ffn_up.weight", &[256, 2], G_IQ2_XXS, vec![0; 2 * 66])
        .tensor("odd", &[99, 1], 99, vec![0; 4]);
    let f = open_bytes(&g.bytes()).unwrap();
    for (ty, dtype, len) in kept {
        let t = f.tensor(&format!("t{ty}")).unwrap();
        assert_eq!(t.dtype, dtype);
        assert_eq!(t.shape, vec![2, 256]);
        assert_eq!(t.data.len(), len);
        assert_eq!(t.row_bytes, len / 2);
        assert_eq!(gguf::dtype_for_ggml(ty), Some(dtype));
    }
    match f.tensor("blk.3.ffn_up.weight") {
        Err(Error::UnsupportedDType(msg)) => {
            assert!(msg.contains("blk.3.ffn_up.weight"), "{msg}");
            assert!(msg.contains("iq2_xxs (16)"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    let msg = f.tensor("odd").unwrap_err().to_string();
    assert!(
        msg.contains("'odd'") && msg.contains("unknown type 99"),
        "{msg}"
    );
    assert_eq!(gguf::ggml_type_name(10), Some("q2_k"));
}

#[test]
fn quantized_rows_must_be_whole_blocks() {
    let mut g = Gguf::new(3);
    g.tensor("w", &[48, 2], G_Q4_0, vec![0; 3 * 18]);
    let f = open_bytes(&g.bytes()).unwrap();
    let msg = f.tensor("w").unwrap_err().to_string();
    assert!(
        msg.contains("'w'") && msg.contains("not whole blocks of 32"),
        "{msg}"
    );
}

// ------------------------------------------------------------ corrupt files

#[test]
fn bad_magic_and_short_files() {
    let msg = bad_gguf(b"GGML\x03\0\0\0");
    assert!(msg.contains("bad magic") && msg.contains("GGML"), "{msg}");
    let msg = bad_gguf(b"GG");
    assert!(msg.contains("too short"), "{msg}");
    let msg = bad_gguf(b"");
    assert!(msg.contains("too short"), "{msg}");
}

#[test]
fn unknown_versions_are_rejected() {
    for (version, hint) in [
        (1, "version 1 is obsolete"),
        (4, "unsupported version 4"),
        (3u32.swap_bytes(), "big-endian"),
    ] {
        let msg = bad_gguf(&Gguf::new(version).bytes());
        assert!(msg.contains(hint), "{version}: {msg}");
        assert!(msg.contains("reads versions 2 and 3"), "{msg}");
    }
}

#[test]
fn every_truncation_of_the_header_is_an_error() {
    let g = tiny_llama(&Tiny::default());
    let bytes = g.bytes();
    let f = open_bytes(&bytes).unwrap();
    let header_end = f.data_start() as usize;
    // Cutting anywhere inside the header fails cleanly (never a panic).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    for len in 0..header_end {
        std::fs::write(&path, &bytes[..len]).unwrap();
        match GgufFile::open(&path) {
            Err(Error::BadGguf(_)) => {}
            other => panic!("cut at {len}: {other:?}"),
        }
    }
    // Cutting inside the data leaves the header readable but the tensors that
    // no longer fit are out of bounds.
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let f = GgufFile::open(&path).unwrap();
    match f.tensor("output_norm.weight") {
        Err(Error::TensorOutOfBounds { name, file_len, .. }) => {
            assert_eq!(name, "output_norm.weight");
            assert_eq!(file_len as usize, bytes.len() - 1);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn truncated_kv_section_names_the_entry() {
    let mut g = Gguf::new(3);
    g.u32("first", 1).string("second.key", "some text");
    let mut bytes = g.bytes();
    bytes.truncate(g.infos_start() - 3);
    let msg = bad_gguf(&bytes);
    assert!(
        msg.contains("truncated") && msg.contains("'second.key'"),
        "{msg}"
    );
    // More entries announced than present.
    let mut bytes = Gguf::new(2).bytes();
    bytes.truncate(24);
    bytes[16..24].copy_from_slice(&5u64.to_le_bytes());
    let msg = bad_gguf(&bytes);
    assert!(
        msg.contains("truncated") && msg.contains("metadata entry 0"),
        "{msg}"
    );
}

#[test]
fn string_length_past_the_end_is_an_error() {
    let mut g = Gguf::new(3);
    let mut payload = (u64::MAX - 3).to_le_bytes().to_vec();
    payload.extend_from_slice(b"abc");
    g.raw("s", T_STRING, &payload);
    let msg = bad_gguf(&g.bytes());
    assert!(
        msg.contains("truncated") && msg.contains("metadata 's'"),
        "{msg}"
    );
    // The same for a key.
    let mut bytes = Gguf::new(3).bytes();
    bytes.truncate(24);
    bytes[16..24].copy_from_slice(&1u64.to_le_bytes());
    bytes.extend(1000u64.to_le_bytes());
    bytes.extend_from_slice(b"key");
    let msg = bad_gguf(&bytes);
    assert!(msg.contains("needs 1000 bytes"), "{msg}");
}

#[test]
fn invalid_utf8_and_bad_bools_are_errors() {
    let mut g = Gguf::new(3);
    let mut payload = 2u64.to_le_bytes().to_vec();
    payload.extend_from_slice(&[0xff, 0xfe]);
    g.raw("s", T_STRING, &payload);
    assert!(bad_gguf(&g.bytes()).contains("not UTF-8"));
    let mut g = Gguf::new(3);
    g.raw("b", T_BOOL, &[2]);
    assert!(bad_gguf(&g.bytes()).contains("byte 2"));
}

#[test]
fn unknown_value_types_are_errors() {
    let mut g = Gguf::new(3);
    g.raw("weird", 13, &[0; 8]);
    let msg = bad_gguf(&g.bytes());
    assert!(
        msg.contains("'weird'") && msg.contains("unknown value type 13"),
        "{msg}"
    );
    // Inside an array.
    let mut g = Gguf::new(3);
    let mut payload = 77u32.to_le_bytes().to_vec();
    payload.extend(1u64.to_le_bytes());
    payload.push(0);
    g.raw("arr", T_ARRAY, &payload);
    let msg = bad_gguf(&g.bytes());
    assert!(
        msg.contains("'arr'") && msg.contains("unknown value type 77"),
        "{msg}"
    );
}

#[test]
fn huge_array_counts_fail_without_allocating() {
    for ty in [T_U8, T_U64, T_STRING, T_ARRAY] {
        let mut g = Gguf::new(3);
        let mut payload = ty.to_le_bytes().to_vec();
        payload.extend((u64::MAX / 2).to_le_bytes());
        g.raw("big", T_ARRAY, &payload);
        let msg = bad_gguf(&g.bytes());
        assert!(msg.contains("truncated") && msg.contains("claims"), "{msg}");
    }
}

#[test]
fn deeply_nested_arrays_are_rejected() {
    let mut payload = Vec::new();
    for _ in 0..20 {
        payload.extend(T_ARRAY.to_le_bytes());
        payload.extend(1u64.to_le_bytes());
    }
    payload.extend(T_U8.to_le_bytes());
    payload.extend(0u64.to_le_bytes());
    let mut g = Gguf::new(3);
    g.raw("deep", T_ARRAY, &payload);
    let msg = bad_gguf(&g.bytes());
    assert!(msg.contains("nests arrays"), "{msg}");
}

#[test]
fn bad_tensor_descriptions_are_errors() {
    let mut g = Gguf::new(3);
    g.tensor("a", &[1, 1, 1, 1, 1], G_F32, vec![0; 4]);
    assert!(bad_gguf(&g.bytes()).contains("'a' has 5 dimensions"));
    let mut g = Gguf::new(3);
    g.tensor("z", &[4, 0], G_F32, vec![]);
    assert!(bad_gguf(&g.bytes()).contains("zero dimension"));
    let mut g = Gguf::new(3);
    g.tensor("huge", &[u64::MAX, 4], G_F32, vec![]);
    assert!(bad_gguf(&g.bytes()).contains("too large"));
    let mut g = Gguf::new(3);
    g.tensor("dup", &[1], G_F32, vec![0; 4])
        .tensor("dup", &[1], G_F32, vec![0; 4]);
    assert!(bad_gguf(&g.bytes()).contains("'dup' is described twice"));
    let mut g = Gguf::new(3);
    g.u32("k", 1).u32("k", 2);
    assert!(bad_gguf(&g.bytes()).contains("'k' appears twice"));
    let mut g = Gguf::new(3);
    g.string("general.alignment", "32");
    assert!(bad_gguf(&g.bytes()).contains("general.alignment' must be a u32, found string"));
    let mut g = Gguf::new(3);
    g.u32("general.alignment", 0);
    assert!(bad_gguf(&g.bytes()).contains("general.alignment is 0"));
}

#[test]
fn tensor_data_past_the_end_is_out_of_bounds() {
    let mut g = Gguf::new(3);
    g.tensor("w", &[4, 4], G_F32, vec![0; 64]);
    let mut bytes = g.bytes();
    bytes.truncate(bytes.len() - 4);
    let f = open_bytes(&bytes).unwrap();
    match f.tensor("w") {
        Err(Error::TensorOutOfBounds { name, len, .. }) => {
            assert_eq!(name, "w");
            assert_eq!(len, 64);
        }
        other => panic!("{other:?}"),
    }
    // An offset so large that start + len overflows.
    let mut g = Gguf::new(3);
    g.tensor("w", &[4], G_F32, vec![0; 16]);
    let mut bytes = g.bytes();
    // The offset field follows the name (8 + 1), n_dims (4), ne (8) and type (4).
    let pos = g.infos_start() + 8 + 1 + 4 + 8 + 4;
    bytes[pos..pos + 8].copy_from_slice(&(u64::MAX - 4).to_le_bytes());
    let f = open_bytes(&bytes).unwrap();
    assert!(matches!(
        f.tensor("w"),
        Err(Error::TensorOutOfBounds { .. })
    ));
    // The importer reports the same before writing anything.
    let g = tiny_llama(&Tiny::default());
    let mut bytes = g.bytes();
    bytes.truncate(bytes.len() - 1);
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "m.gguf", &bytes);
    let out = dir.path().join("m.mllm");
    let err = convert(&input, &out, &ConvertOptions::default()).unwrap_err();
    assert!(matches!(err, Error::TensorOutOfBounds { .. }), "{err}");
    assert!(!out.exists());
}

// ------------------------------------------------------------------ import

#[test]
fn imports_a_tiny_llama_from_v2_and_v3() {
    for version in [2, 3] {
        let (_dir, f) = import_ok(&tiny_llama(&Tiny {
            version,
            ..Tiny::default()
        }));
        let meta = f.metadata().unwrap();
        assert_eq!(meta.architecture, "LlamaForCausalLM");
        let names: Vec<&str> = meta.tensors.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "model.embed_tokens.weight",
                "model.layers.0.input_layernorm.weight",
                "model.layers.0.mlp.down_proj.weight",
                "model.layers.0.mlp.gate_proj.weight",
                "model.layers.0.mlp.up_proj.weight",
                "model.layers.0.post_attention_layernorm.weight",
                "model.layers.0.self_attn.k_proj.weight",
                "model.layers.0.self_attn.o_proj.weight",
                "model.layers.0.self_attn.q_proj.weight",
                "model.layers.0.self_attn.v_proj.weight",
                "model.norm.weight",
            ]
        );
        let shape = |n: &str| meta.tensors[n].clone();
        assert_eq!(shape("model.embed_tokens.weight"), [8, 32]);
        assert_eq!(shape("model.layers.0.self_attn.q_proj.weight"), [32, 32]);
        assert_eq!(shape("model.layers.0.self_attn.k_proj.weight"), [16, 32]);
        assert_eq!(shape("model.layers.0.mlp.down_proj.weight"), [32, 64]);
        assert_eq!(shape("model.layers.0.input_layernorm.weight"), [32]);
        // Tensors other than q/k keep their bytes.
        let down = f.tensor("model.layers.0.mlp.down_proj.weight").unwrap();
        assert_eq!(down.bytes(), &rows_f32(HIDDEN, FFN)[..]);
        assert_eq!(down.dtype(), DType::F32);
        let v = f.tensor("model.layers.0.self_attn.v_proj.weight").unwrap();
        assert_eq!(row_ids(v.bytes(), 32), (0..16).collect::<Vec<_>>());
        assert_eq!(f.chat_template().unwrap(), Some(TEMPLATE));
        assert!(f.tokenizer_json().unwrap().is_some());
    }
}

#[test]
fn q_and_k_rows_return_to_the_rotary_half_layout() {
    let (_dir, f) = import_ok(&tiny_llama(&Tiny::default()));
    // head_dim 8: HF rows 0..4 are the first rotary half (GGUF rows 0,2,4,6),
    // rows 4..8 the second half (GGUF rows 1,3,5,7); the same in every head.
    let q = f.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(
        row_ids(q.bytes(), 32),
        [
            0, 2, 4, 6, 1, 3, 5, 7, //
            8, 10, 12, 14, 9, 11, 13, 15, //
            16, 18, 20, 22, 17, 19, 21, 23, //
            24, 26, 28, 30, 25, 27, 29, 31
        ]
    );
    // k has 2 kv heads.
    let k = f.tensor("model.layers.0.self_attn.k_proj.weight").unwrap();
    assert_eq!(
        row_ids(k.bytes(), 32),
        [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15]
    );
    // Columns stay in place.
    let row0: Vec<f32> = q.bytes()[4 * 32..8 * 32]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(row0, (0..32).map(|c| (2000 + c) as f32).collect::<Vec<_>>());
    // The mapping function agrees.
    let hf_to_gguf: Vec<usize> = (0..8).map(|r| gguf::rotary::gguf_row_of(r, 8)).collect();
    assert_eq!(hf_to_gguf, [0, 2, 4, 6, 1, 3, 5, 7]);
}

#[test]
fn quantized_q_rows_are_moved_whole() {
    let (_dir, f) = import_ok(&tiny_llama(&Tiny {
        q_type: G_Q4_1,
        ..Tiny::default()
    }));
    let q = f.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.dtype(), DType::Q4_1);
    assert_eq!(q.shape().dims(), [32, 32]);
    let rows: Vec<u8> = q
        .bytes()
        .chunks_exact(20)
        .map(|row| {
            assert!(row.iter().all(|&b| b == row[0]));
            row[0]
        })
        .collect();
    let expected: Vec<u8> = (0..4)
        .flat_map(|h| [0, 2, 4, 6, 1, 3, 5, 7].map(|r| h * 8 + r))
        .collect();
    assert_eq!(rows, expected);
}

#[test]
fn config_is_synthesized_from_the_metadata() {
    let (_dir, f) = import_ok(&tiny_llama(&Tiny::default()));
    let meta = f.metadata().unwrap();
    let c = &meta.config;
    assert_eq!(c["architectures"], json!(["LlamaForCausalLM"]));
    assert_eq!(c["model_type"], "llama");
    assert_eq!(c["hidden_size"], 32);
    assert_eq!(c["intermediate_size"], 64);
    assert_eq!(c["num_hidden_layers"], 1);
    assert_eq!(c["num_attention_heads"], 4);
    assert_eq!(c["num_key_value_heads"], 2);
    assert_eq!(c["head_dim"], 8);
    assert_eq!(c["vocab_size"], 8);
    assert_eq!(c["max_position_embeddings"], 128);
    // The stored f32, widened exactly.
    assert_eq!(c["rms_norm_eps"].as_f64(), Some(9.999999747378752e-06));
    assert_eq!(c["rope_theta"].as_f64(), Some(10000.0));
    assert_eq!(c["rope_scaling"], serde_json::Value::Null);
    assert_eq!(c["hidden_act"], "silu");
    assert_eq!(c["tie_word_embeddings"], true);
    assert_eq!(c["bos_token_id"], 1);
    assert_eq!(c["eos_token_id"], 2);
    assert_eq!(c["pad_token_id"], 2);
    assert_eq!(
        meta.generation_config,
        Some(json!({"bos_token_id": 1, "eos_token_id": 2}))
    );
    // The synthesized JSON text carries the exact epsilon.
    let text = serde_json::to_string(c).unwrap();
    assert!(
        text.contains("\"rms_norm_eps\":9.999999747378752e-6"),
        "{text}"
    );

    let (_dir, f) = import_ok(&tiny_llama(&Tiny {
        rope_base: Some(100000.0),
        eps: 1e-6,
        ..Tiny::default()
    }));
    let c = &f.metadata().unwrap().config;
    assert_eq!(c["rope_theta"].as_f64(), Some(100000.0));
    assert_eq!(c["rms_norm_eps"].as_f64(), Some(f64::from(1e-6f32)));
}

#[test]
fn head_is_tied_without_output_weight_and_untied_with_it() {
    let (_dir, tied) = import_ok(&tiny_llama(&Tiny::default()));
    assert_eq!(tied.metadata().unwrap().config["tie_word_embeddings"], true);
    assert!(!tied.entries().contains_key("lm_head.weight"));

    let (_dir, untied) = import_ok(&tiny_llama(&Tiny {
        untied: true,
        ..Tiny::default()
    }));
    let meta = untied.metadata().unwrap();
    assert_eq!(meta.config["tie_word_embeddings"], false);
    assert_eq!(meta.tensors["lm_head.weight"], [8, 32]);
    let head = untied.tensor("lm_head.weight").unwrap();
    assert_eq!(head.bytes(), &rows_f32(8, HIDDEN)[..]);
}

#[test]
fn imported_tiny_model_loads_and_runs() {
    let (_dir, out) = import(&tiny_llama(&Tiny::default())).unwrap();
    let mut model = mllm_models::Model::load(&out, &Default::default()).unwrap();
    assert_eq!(model.vocab_size(), 8);
    assert_eq!(model.bos_id(), Some(1));
    assert_eq!(model.eos_ids(), [2]);
    let step = StepInput::single(0, vec![1, 5, 7], LogitsMode::Last);
    let logits = model.step(&step).unwrap();
    assert_eq!(logits.shape().dims(), [1, 8]);
    assert!(logits.data().iter().all(|x| x.is_finite()));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "encoding runs Oniguruma, C code that Miri cannot interpret"
)]
fn tokenizer_is_rebuilt_from_the_metadata() {
    let (_dir, f) = import_ok(&tiny_llama(&Tiny::default()));
    let tok = Tokenizer::from_json(f.tokenizer_json().unwrap().unwrap()).unwrap();
    assert_eq!(tok.encode("ab ab", false).unwrap(), [5, 7]);
    assert_eq!(tok.encode("ab ab", true).unwrap(), [5, 7]);
    assert_eq!(
        tok.encode("<|im_start|>ab<|im_end|>", false).unwrap(),
        [1, 5, 2]
    );
    assert_eq!(tok.encode("ba", false).unwrap(), [4, 3]);
    assert_eq!(
        tok.decode(&[1, 5, 7, 2], false).unwrap(),
        "<|im_start|>ab ab<|im_end|>"
    );
    assert_eq!(tok.decode(&[1, 5, 7, 2], true).unwrap(), "ab ab");
    assert_eq!(tok.inner().get_vocab_size(true), 8);
    let json: serde_json::Value =
        serde_json::from_str(f.tokenizer_json().unwrap().unwrap()).unwrap();
    let added: Vec<(u64, bool)> = json["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_u64().unwrap(), t["special"].as_bool().unwrap()))
        .collect();
    assert_eq!(added, [(0, true), (1, true), (2, true)]);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "encoding runs Oniguruma, C code that Miri cannot interpret"
)]
fn add_bos_token_makes_the_tokenizer_prepend_it() {
    let mut g = tiny_metadata_without("tokenizer.ggml.add_bos_token");
    g.bool("tokenizer.ggml.add_bos_token", true)
        .bool("tokenizer.ggml.add_eos_token", true);
    let (_dir, f) = import_ok(&g);
    let tok = Tokenizer::from_json(f.tokenizer_json().unwrap().unwrap()).unwrap();
    assert_eq!(tok.encode("ab", true).unwrap(), [1, 5, 2]);
    assert_eq!(tok.encode("ab", false).unwrap(), [5]);
    let pair = tok.inner().encode(("ab", "b"), true).unwrap();
    assert_eq!(pair.get_ids(), [1, 5, 2, 1, 4, 2]);
    assert_eq!(pair.get_type_ids(), [0, 0, 0, 1, 1, 1]);
}

#[test]
fn unsupported_tokenizers_are_named() {
    let cases = [
        ("tokenizer.ggml.model", "bert", "tokenizer model 'bert'"),
        ("tokenizer.ggml.pre", "falcon", "pre-tokenizer 'falcon'"),
    ];
    for (key, value, expected) in cases {
        let mut g = tiny_metadata_without(key);
        g.string(key, value);
        let err = import_err(&g);
        assert!(matches!(err, Error::Tokenizer(_)), "{err:?}");
        assert!(err.to_string().contains(expected), "{err}");
    }
    // A SentencePiece vocabulary needs one score per token.
    let mut g = tiny_metadata_without("tokenizer.ggml.model");
    g.string("tokenizer.ggml.model", "llama");
    let err = import_err(&g);
    assert!(matches!(err, Error::BadGguf(_)), "{err:?}");
    assert!(err.to_string().contains("tokenizer.ggml.scores"), "{err}");
    g.f32s("tokenizer.ggml.scores", &[0.0; 3]);
    let msg = import_err(&g).to_string();
    assert!(msg.contains("3 entries for 8 tokens"), "{msg}");
    // With scores, the same tokens make a SentencePiece tokenizer (which
    // needs no pre-tokenizer).
    let mut g = tiny_metadata_without("tokenizer.ggml.model");
    g.string("tokenizer.ggml.model", "llama")
        .f32s("tokenizer.ggml.scores", &[0.0; 8]);
    import_ok(&g);
    // No pre-tokenizer named: the splitting rules are unknown.
    let err = import_err(&tiny_metadata_without("tokenizer.ggml.pre"));
    assert!(err.to_string().contains("tokenizer.ggml.pre"), "{err}");
    // No tokenizer at all: the model converts without one.
    let mut g = Gguf::new(3);
    let full = tiny_llama(&Tiny::default());
    let f = open_bytes(&full.bytes()).unwrap();
    for (key, value) in f.metadata() {
        if !key.starts_with("tokenizer.") {
            if let GgufValue::String(s) = value {
                g.string(key, s);
            } else if let GgufValue::U32(v) = value {
                g.u32(key, *v);
            } else if let GgufValue::F32(v) = value {
                g.f32(key, *v);
            }
        }
    }
    g.tensors = full.tensors;
    let (_dir, f) = import_ok(&g);
    assert_eq!(f.tokenizer_json().unwrap(), None);
    assert_eq!(f.chat_template().unwrap(), None);
    assert_eq!(f.metadata().unwrap().config["vocab_size"], 8);
}

#[test]
fn wrong_metadata_array_types_are_errors() {
    // tokens given as an array of u32
    let mut g = tiny_metadata_without("tokenizer.ggml.tokens");
    let mut p = T_U32.to_le_bytes().to_vec();
    p.extend(8u64.to_le_bytes());
    for i in 0..8u32 {
        p.extend(i.to_le_bytes());
    }
    g.raw("tokenizer.ggml.tokens", T_ARRAY, &p);
    let msg = import_err(&g).to_string();
    assert!(
        msg.contains("'tokenizer.ggml.tokens' must be an array of string, found array of u32"),
        "{msg}"
    );
    // token types given as strings
    let mut g = tiny_metadata_without("tokenizer.ggml.token_type");
    g.strings("tokenizer.ggml.token_type", &["1"; 8]);
    let msg = import_err(&g).to_string();
    assert!(
        msg.contains(
            "'tokenizer.ggml.token_type' must be an array of integers, found array of string"
        ),
        "{msg}"
    );
    // a count given as a string
    let mut g = tiny_metadata_without("llama.block_count");
    g.string("llama.block_count", "1");
    let msg = import_err(&g).to_string();
    assert!(
        msg.contains("'llama.block_count' must be a non-negative integer, found string"),
        "{msg}"
    );
    // token types of the wrong length
    let mut g = tiny_metadata_without("tokenizer.ggml.token_type");
    g.i32s("tokenizer.ggml.token_type", &[1, 1]);
    let msg = import_err(&g).to_string();
    assert!(msg.contains("2 entries for 8 tokens"), "{msg}");
    // a merge that is not a pair
    let mut g = tiny_metadata_without("tokenizer.ggml.merges");
    g.strings("tokenizer.ggml.merges", &["a b", "abc"]);
    let msg = import_err(&g).to_string();
    assert!(msg.contains("merge 1 (\"abc\")"), "{msg}");
    // a special id outside the vocabulary
    let mut g = tiny_metadata_without("tokenizer.ggml.eos_token_id");
    g.u32("tokenizer.ggml.eos_token_id", 99);
    let msg = import_err(&g).to_string();
    assert!(msg.contains("special token id 99"), "{msg}");
    // a missing required key
    let g = tiny_metadata_without("llama.context_length");
    let msg = import_err(&g).to_string();
    assert!(msg.contains("'llama.context_length' is missing"), "{msg}");
}

/// The tiny model with one metadata key left out (to be re-added differently).
fn tiny_metadata_without(skip: &str) -> Gguf {
    let full = tiny_llama(&Tiny::default());
    let bytes = full.bytes();
    let mut out = Gguf::new(full.version);
    out.tensors = full.tensors;
    // Re-read the entries through the reader and re-emit all but `skip`.
    let f = open_bytes(&bytes).unwrap();
    for (key, value) in f.metadata() {
        if key == skip {
            continue;
        }
        match value {
            GgufValue::String(s) => out.string(key, s),
            GgufValue::U32(v) => out.u32(key, *v),
            GgufValue::F32(v) => out.f32(key, *v),
            GgufValue::Bool(v) => out.bool(key, *v),
            GgufValue::Array(GgufArray::String(v)) => {
                let v: Vec<&str> = v.iter().map(String::as_str).collect();
                out.strings(key, &v)
            }
            GgufValue::Array(GgufArray::I32(v)) => out.i32s(key, v),
            other => panic!("unexpected {other:?}"),
        };
    }
    out
}

#[test]
fn unsupported_architecture_and_tensors_are_errors() {
    let mut g = tiny_metadata_without("general.architecture");
    g.string("general.architecture", "gemma2");
    match import_err(&g) {
        Error::UnsupportedArchitecture(a) => assert!(a.contains("gemma2"), "{a}"),
        other => panic!("{other:?}"),
    }
    let mut g = tiny_llama(&Tiny::default());
    g.tensor("blk.0.ffn_gate_exps.weight", &[4], G_F32, vec![0; 16]);
    let msg = import_err(&g).to_string();
    assert!(msg.contains("'blk.0.ffn_gate_exps.weight'"), "{msg}");
    let mut g = tiny_llama(&Tiny::default());
    g.tensor("rope_freqs.weight", &[4], G_F32, vec![0; 16]);
    let msg = import_err(&g).to_string();
    assert!(msg.contains("rotary frequency factors"), "{msg}");
    let mut g = tiny_llama(&Tiny::default());
    g.tensor("blk.5.ffn_up.weight", &[32, 64], G_F32, rows_f32(64, 32));
    let msg = import_err(&g).to_string();
    assert!(
        msg.contains("layer 5") && msg.contains("block_count is 1"),
        "{msg}"
    );
    // A kept-type check on the model: an IQ2_XXS matrix names the tensor and type.
    let mut g = tiny_llama(&Tiny::default());
    let up = g
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.0.ffn_up.weight")
        .unwrap();
    up.ne = vec![256, 8];
    up.ty = G_IQ2_XXS;
    up.data = vec![0; 8 * 66];
    match import_err(&g) {
        Error::UnsupportedDType(msg) => {
            assert!(
                msg.contains("'blk.0.ffn_up.weight'") && msg.contains("iq2_xxs"),
                "{msg}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn embedding_must_exist_and_match_the_vocabulary() {
    let mut g = tiny_llama(&Tiny::default());
    g.tensors.retain(|t| t.name != "token_embd.weight");
    assert!(matches!(import_err(&g), Error::MissingTensor(n) if n == "token_embd.weight"));
    let mut g = tiny_llama(&Tiny::default());
    let embed = &mut g.tensors[0];
    assert_eq!(embed.name, "token_embd.weight");
    embed.ne = vec![HIDDEN, 9];
    embed.data = rows_f32(9, HIDDEN);
    let msg = import_err(&g).to_string();
    assert!(msg.contains("[9, 32]") && msg.contains("8 tokens"), "{msg}");
    // q rows that do not match the heads
    let mut g = tiny_metadata_without("llama.attention.head_count_kv");
    g.u32("llama.attention.head_count_kv", 1);
    let msg = import_err(&g).to_string();
    assert!(
        msg.contains("attn_k.weight") && msg.contains("16 rows, expected 1 key/value heads of 8"),
        "{msg}"
    );
}

#[test]
fn rope_scaling_and_partial_rotary_are_rejected() {
    let mut g = tiny_llama(&Tiny::default());
    g.string("llama.rope.scaling.type", "yarn");
    let msg = import_err(&g).to_string();
    assert!(msg.contains("'yarn'"), "{msg}");
    let mut g = tiny_metadata_without("llama.rope.dimension_count");
    g.u32("llama.rope.dimension_count", 4);
    let msg = import_err(&g).to_string();
    assert!(msg.contains("partial rotary"), "{msg}");
}

#[test]
fn dtype_option_is_rejected_for_gguf_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "m.bin", &tiny_llama(&Tiny::default()).bytes());
    let opts = ConvertOptions {
        dtype: DType::F16,
        progress: false,
    };
    // Recognised by its magic, whatever the name.
    match convert(&input, &dir.path().join("m.mllm"), &opts) {
        Err(Error::InvalidInput(msg)) => assert!(msg.contains("kept as stored"), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert!(gguf::is_gguf(&input));
    let text = write(dir.path(), "model.safetensors", b"not gguf");
    assert!(!gguf::is_gguf(&text));
    // A damaged file named .gguf is reported by the GGUF reader.
    let bad = write(dir.path(), "bad.gguf", b"nope");
    let err = convert(&bad, &dir.path().join("b.mllm"), &ConvertOptions::default()).unwrap_err();
    assert!(matches!(err, Error::BadGguf(_)), "{err}");
}

#[test]
fn inspect_shows_the_imported_file() {
    let (dir, out) = import(&tiny_llama(&Tiny {
        q_type: G_Q4_1,
        ..Tiny::default()
    }))
    .unwrap();
    let text = inspect(&out).unwrap();
    assert!(text.contains("LlamaForCausalLM (family llama)"), "{text}");
    assert!(text.contains("tokenizer:      embedded"), "{text}");
    assert!(text.contains("chat template:  embedded"), "{text}");
    assert!(text.contains("f32: 10, q4_1: 1"), "{text}");
    drop(dir);
}

/// `inspect` on a GGUF file itself: its metadata, a tensor table in the
/// Hugging Face shape order, and types it does not read shown as `?`.
#[test]
fn inspect_reads_gguf_files() {
    let mut g = tiny_llama(&Tiny::default());
    g.tensor("extra.weight", &[256, 2], G_IQ2_XXS, vec![0; 2 * 66]);
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "m.gguf", &g.bytes());
    let text = inspect(&path).unwrap();
    for want in [
        "format:         GGUF v3",
        "architecture:   llama (imports as LlamaForCausalLM)",
        "  llama.block_count = 1",
        "  tokenizer.ggml.model = \"gpt2\"",
        "  tokenizer.ggml.merges = [\"a b\",\"Ġ ab\"]",
        "  llama.attention.layer_norm_rms_epsilon = 0.00001",
    ] {
        assert!(text.lines().any(|l| l == want), "{want:?} in\n{text}");
    }
    let row = |name: &str| -> Vec<&str> {
        let line = text.lines().find(|l| l.starts_with(&format!("{name} ")));
        line.unwrap_or_else(|| panic!("no row {name} in\n{text}"))
            .split_whitespace()
            .collect()
    };
    assert_eq!(row("extra.weight")[1..5], ["iq2_xxs", "[2,", "256]", "?"]);
    let embd = row("token_embd.weight");
    assert_eq!(embd[1..3], ["f32", "[8,"]);
    assert_eq!(embd[4], (8 * HIDDEN * 4).to_string());
    assert!(text.contains("iq2_xxs (16): 1"), "{text}");
    let mut g = tiny_metadata_without("general.architecture");
    g.string("general.architecture", "mamba");
    let path = write(dir.path(), "mamba.gguf", &g.bytes());
    let text = inspect(&path).unwrap();
    assert!(
        text.contains("mamba (not imported by this build)"),
        "{text}"
    );
}

#[test]
#[cfg_attr(miri, ignore = "Miri cannot start processes")]
fn cli_converts_gguf_and_explains_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "m.gguf", &tiny_llama(&Tiny::default()).bytes());
    let out = dir.path().join("m.mllm");
    let bin = env!("CARGO_BIN_EXE_mllm-convert");
    let run = Command::new(bin)
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .arg("--quiet")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("wrote 11 tensors (LlamaForCausalLM, f32)"),
        "{stdout}"
    );
    assert!(MllmFile::open(&out).is_ok());

    let run = Command::new(bin)
        .arg(&input)
        .args(["-o", "x.mllm", "--dtype", "q4_0"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("GGUF tensors are kept as stored"),
        "{stderr}"
    );
    assert!(!dir.path().join("x.mllm").exists());
}

// ----------------------- found by the mutation campaign (tests/hostile_files.rs)

/// Found by the campaign: a block count of billions made the import build
/// billions of layers (an allocation abort). It is now an error naming
/// the key, before anything is built for it.
#[test]
fn a_block_count_beyond_the_tensors_is_an_error() {
    let err = import_err(&tiny_llama(&Tiny {
        block_count: 3_000_000_000,
        ..Tiny::default()
    }));
    let msg = err.to_string();
    assert!(
        msg.contains("'num_hidden_layers' is 3000000000") && msg.contains("only 11 tensors"),
        "{msg}"
    );
}

/// Found by the campaign: a row of 2^62 values overflowed the byte count
/// (a panic in debug builds). It is now a named error.
#[test]
fn a_row_length_whose_bytes_overflow_is_an_error() {
    let mut g = tiny_llama(&Tiny::default());
    let norm = g
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.0.ffn_norm.weight")
        .unwrap();
    norm.ne = vec![1 << 62];
    let msg = import_err(&g).to_string();
    assert!(
        msg.contains("blk.0.ffn_norm.weight") && msg.contains("more bytes than fit in memory"),
        "{msg}"
    );
}
