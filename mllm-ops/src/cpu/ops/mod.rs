//! CPU implementations of every [`OpDesc`](mllm_core::OpDesc).

mod attention;
mod elementwise;
mod embedding;
mod kv_cache;
mod linear;
mod norm;
mod pieces;
mod position_embedding;
mod rope;
mod select_rows;
mod slice_columns;

pub use attention::AttentionOp;
pub use elementwise::{ActivationOp, BinaryOp, GluOp, ScaleOp, SoftmaxOp};
pub use embedding::EmbeddingOp;
pub use kv_cache::{KvCacheOp, KvCacheState};
pub use linear::LinearOp;
pub use norm::{LayerNormOp, RmsNormOp};
pub use position_embedding::PositionEmbeddingOp;
pub use rope::{RopeAngles, RopeOp};
pub use select_rows::SelectLogitsRowsOp;
pub use slice_columns::SliceColumnsOp;

use mllm_core::{Error, Result, Shape};

/// Checks that `shape` is `[rows, cols]` and returns `rows`.
pub(crate) fn expect_rows(op: &str, what: &str, shape: &Shape, cols: usize) -> Result<usize> {
    match shape.dims() {
        [rows, c] if *c == cols => Ok(*rows),
        _ => Err(Error::shape(
            op,
            format!("{what} must be [tokens, {cols}], got {shape}"),
        )),
    }
}
