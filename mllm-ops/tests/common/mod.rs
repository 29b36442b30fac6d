//! Helpers shared by the integration tests that write `.mllm` files.

use std::path::{Path, PathBuf};

use mllm_core::op::{Op, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::tensor::TensorRef;
use mllm_core::Shape;

/// Deterministic values in `[-1, 1)` (xorshift64*).
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let r = s.wrapping_mul(0x2545_F491_4F6C_DD1D);
            (r >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A path for one `.mllm` file in a fresh temp directory of its own (so
/// tests running at once never share a file), removed on drop.
pub struct TempFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl TempFile {
    /// A fresh directory and the path of `name` inside it.
    pub fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("a temp directory");
        let path = dir.path().join(name);
        Self { _dir: dir, path }
    }

    /// Where the file is (written by the caller).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Runs a loaded linear op on `rows` activation rows of `in_f`, checking
/// that its output is `[rows, out_f]`.
pub fn run_linear(op: &mut dyn Op, x: &[f32], rows: usize, in_f: usize, out_f: usize) -> Vec<f32> {
    let step = StepLayout::default();
    let shape = Shape::new([rows, in_f]);
    assert_eq!(op.reshape(&[&shape], &step).unwrap().dims(), [rows, out_f]);
    let mut y = vec![f32::NAN; rows * out_f];
    let input = OpInput::Tensor(TensorRef {
        shape: &shape,
        data: x,
    });
    op.execute(&[input], &mut y, &step).unwrap();
    y
}
