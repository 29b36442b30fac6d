//! Backends turn op descriptions into runnable ops for one device.

use std::sync::Arc;

use crate::op::{Op, OpDesc};
use crate::{DType, Result};

/// Runs a whole step in a backend's execution context, e.g. on a worker of
/// its thread pool, so that the parallel ops inside the step start their
/// work from a worker instead of handing it over from another thread.
pub trait StepRunner: Send + Sync {
    /// Calls `f` (one step) once, in the backend's context, and returns
    /// when it is done.
    fn run(&self, f: &mut (dyn FnMut() + Send));
}

/// A device family (CPU, CUDA, ...) that can instantiate ops.
pub trait Backend {
    /// A short name for messages (`cpu`, `cuda:0`).
    fn name(&self) -> String;

    /// Creates the op for `desc`, or an error when this backend lacks it.
    fn create_op(&self, desc: &OpDesc) -> Result<Box<dyn Op>>;

    /// Whether linear layers with `dtype` weights on the same input run
    /// faster as one [`OpDesc::StackedLinear`] on this backend (see
    /// [`crate::stacking`]). No by default.
    fn stacks_linears(&self, _dtype: DType) -> bool {
        false
    }

    /// Whether a gated MLP's gate and up layers with `dtype` weights and
    /// their gated activation run faster as one [`OpDesc::GatedLinear`] on
    /// this backend (see [`crate::gating`]). No by default.
    fn fuses_gated_linears(&self, _dtype: DType) -> bool {
        false
    }

    /// Where the executor runs each step (`None`: on the calling thread).
    fn step_runner(&self) -> Option<Arc<dyn StepRunner>> {
        None
    }
}
