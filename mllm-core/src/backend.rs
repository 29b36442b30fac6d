//! Backends turn op descriptions into runnable ops for one device.

use crate::op::{Op, OpDesc};
use crate::Result;

/// A device family (CPU, CUDA, ...) that can instantiate ops.
pub trait Backend {
    /// A short name for messages (`cpu`, `cuda:0`).
    fn name(&self) -> String;

    /// Creates the op for `desc`, or an error when this backend lacks it.
    fn create_op(&self, desc: &OpDesc) -> Result<Box<dyn Op>>;
}
