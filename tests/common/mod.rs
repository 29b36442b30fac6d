//! Shared helpers for the end-to-end tests: fixture paths, conversion,
//! reference arrays and comparisons.
#![allow(dead_code)]

pub mod plain_v1;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mllm::convert::{convert, ConvertOptions};
use mllm::core::{DType, Executor, LogitsMode, SeqChunk, StepInput};
use mllm::models::{LoadOptions, Model};
pub use mllm::ops::cpu::kernels::QuantPath;

/// `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// An example binary built by `cargo test` next to the test binaries.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().join("examples");
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: run through `cargo test`, which builds the examples",
        path.display()
    );
    path
}

/// Runs `cmd` and returns its stdout; fails the test with its stderr when
/// it does not succeed.
pub fn stdout_of(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A converted model in a temporary directory (kept alive with the guard).
pub struct Converted {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

/// Converts `input` (a model dir, .safetensors or index) to `dtype`.
pub fn convert_to(input: &Path, dtype: DType) -> Converted {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.mllm");
    convert(
        input,
        &path,
        &ConvertOptions {
            dtype,
            progress: false,
        },
    )
    .unwrap_or_else(|e| panic!("converting {}: {e}", input.display()));
    Converted { dir, path }
}

/// Converts a fixture model directory to f32 and loads it with 2 threads.
pub fn load_fixture(name: &str) -> (Converted, Model) {
    let c = convert_to(&fixture(name), DType::F32);
    let m = load(&c.path);
    (c, m)
}

/// Loads a .mllm file with 2 threads.
pub fn load(path: &Path) -> Model {
    load_with(path, None)
}

/// Loads a .mllm file with 2 threads and the CPU linear layers' activation
/// path `quant_path` (`None`: the default).
pub fn load_with(path: &Path, quant_path: Option<QuantPath>) -> Model {
    load_options(
        path,
        LoadOptions {
            quant_path,
            ..Default::default()
        },
    )
}

/// Loads a .mllm file with 2 threads and the other options of `opts`.
pub fn load_options(path: &Path, opts: LoadOptions) -> Model {
    Model::load(path, &LoadOptions { threads: 2, ..opts })
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// A reference array: shape and values.
pub struct Array {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Array {
    /// Row `i` of the array viewed as `[rows, last]`.
    pub fn row(&self, i: usize) -> &[f32] {
        let n = *self.shape.last().unwrap();
        &self.data[i * n..(i + 1) * n]
    }
}

/// The reference outputs of a fixture: `reference.json` and its arrays.
pub struct Reference {
    pub json: serde_json::Value,
    pub arrays: HashMap<String, Array>,
}

impl Reference {
    pub fn load(name: &str) -> Reference {
        let dir = fixture(name).join("reference");
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
        let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let arrays = st
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                assert_eq!(view.dtype(), safetensors::Dtype::F32);
                let data = view
                    .data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                (
                    name,
                    Array {
                        shape: view.shape().to_vec(),
                        data,
                    },
                )
            })
            .collect();
        Reference { json, arrays }
    }

    pub fn array(&self, name: &str) -> &Array {
        self.arrays
            .get(name)
            .unwrap_or_else(|| panic!("reference array {name} missing"))
    }

    /// Token ids at a JSON pointer (e.g. `/inputs/short`).
    pub fn ids(&self, pointer: &str) -> Vec<u32> {
        self.json
            .pointer(pointer)
            .unwrap_or_else(|| panic!("reference.json has no {pointer}"))
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    }

    /// Numbers at a JSON pointer.
    pub fn floats(&self, pointer: &str) -> Vec<f64> {
        self.json
            .pointer(pointer)
            .unwrap_or_else(|| panic!("reference.json has no {pointer}"))
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    }
}

/// The logits of every position of `ids`, run as one prompt in a fresh
/// slot 0.
pub fn prompt_logits(model: &mut Model, ids: &[u32]) -> mllm::core::Tensor {
    model.reset_slot(0);
    model
        .step(&StepInput::single(0, ids.to_vec(), LogitsMode::All))
        .unwrap()
}

/// The logits behind each of `ids` when they are decoded one at a time
/// after `prompt` in slot 0 with the KV cache: row 0 is the prefill's last
/// position, row k the decode step that consumed `ids[k - 1]`.
pub fn cached_step_logits(model: &mut Model, prompt: &[u32], ids: &[u32]) -> Vec<Vec<f32>> {
    model.reset_slot(0);
    let mut logits = model
        .step(&StepInput::single(0, prompt.to_vec(), LogitsMode::Last))
        .unwrap();
    let mut rows = Vec::with_capacity(ids.len());
    for (k, &id) in ids.iter().enumerate() {
        rows.push(logits.row(0).to_vec());
        if k + 1 < ids.len() {
            logits = model
                .step(&StepInput::single(0, vec![id], LogitsMode::Last))
                .unwrap();
        }
    }
    rows
}

/// Largest absolute difference of two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Asserts `a` and `b` agree within `tol`, naming what was compared.
pub fn assert_close(what: &str, a: &[f32], b: &[f32], tol: f32) {
    let d = max_abs_diff(a, b);
    assert!(d <= tol, "{what}: max abs diff {d} exceeds {tol}");
}

/// Every logits row of a prefill of two sequences on `ex` (the first
/// `prompt` tokens long), then of batched and single decode steps.
pub fn two_sequence_logits(ex: &mut Executor, prompt: u32) -> Vec<Vec<f32>> {
    let chunk = |slot, tokens: Vec<u32>| SeqChunk { slot, tokens };
    let mut rows = Vec::new();
    let mut step = |chunks: Vec<SeqChunk>, logits| {
        let out = ex.step(&StepInput { chunks, logits }).unwrap();
        rows.extend((0..out.rows()).map(|r| out.row(r).to_vec()));
    };
    step(
        vec![chunk(0, (1..=prompt).collect()), chunk(1, vec![5, 6, 7])],
        LogitsMode::All,
    );
    for t in [3, 8, 13] {
        step(
            vec![chunk(0, vec![t]), chunk(1, vec![t + 1])],
            LogitsMode::Last,
        );
        step(vec![chunk(1, vec![t + 2])], LogitsMode::Last);
    }
    rows
}
