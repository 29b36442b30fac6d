//! The CUDA backend: opens `cuda:N` through the driver library, loaded at
//! run time (the `cuda` feature; builds need no CUDA toolkit). It has no op
//! implementations yet, so a node placed on it is a clear
//! [`Error::Device`] naming the op; without the feature, or without the
//! driver library, asking for the device is that error too.

use mllm_core::op::{Op, OpDesc};
use mllm_core::{Backend, Error, Result};

/// A CUDA device.
pub struct CudaBackend {
    ordinal: usize,
    #[cfg(feature = "cuda")]
    _context: std::sync::Arc<cudarc::driver::CudaContext>,
}

impl CudaBackend {
    /// Opens device `ordinal`, or says what is missing: CUDA support in
    /// this build, the driver library, or the device.
    #[cfg(feature = "cuda")]
    pub fn new(ordinal: usize) -> Result<Self> {
        // SAFETY: probing only tries to load the driver library (as cudarc
        // requires before any driver call, which would otherwise panic when
        // the library is absent); it calls no function of it.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::Device(format!(
                "cuda:{ordinal} needs the NVIDIA driver library (libcuda.so), which was not found; use --device cpu"
            )));
        }
        let context = cudarc::driver::CudaContext::new(ordinal)
            .map_err(|e| Error::Device(format!("cannot open cuda:{ordinal}: {e:?}")))?;
        Ok(CudaBackend {
            ordinal,
            _context: context,
        })
    }

    /// Opens device `ordinal`: always an error in a build without CUDA.
    #[cfg(not(feature = "cuda"))]
    pub fn new(ordinal: usize) -> Result<Self> {
        Err(Error::Device(format!(
            "cuda:{ordinal}: this build has no CUDA support; rebuild with `--features cuda`, or use --device cpu"
        )))
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn create_op(&self, desc: &OpDesc) -> Result<Box<dyn Op>> {
        Err(Error::Device(format!(
            "no CUDA implementation of the {} op yet",
            desc.kind_name()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without CUDA support (in the build or the driver) the
    /// error names what is missing; where a GPU is present the device opens.
    #[test]
    fn asking_for_a_missing_device_is_a_named_error() {
        match CudaBackend::new(0) {
            Ok(b) => assert_eq!(b.name(), "cuda:0"),
            Err(e) => {
                let m = e.to_string();
                let named = m.contains("--features cuda") || m.contains("libcuda.so");
                assert!(named || m.contains("cannot open cuda:0"), "{m}");
            }
        }
        let far = CudaBackend::new(4096)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(far.contains("cuda:4096"), "{far}");
    }
}
