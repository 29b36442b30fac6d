//! mllm-ops: op implementations for mllm-rs backends.
//!
//! [`cpu::CpuBackend`] implements every op; its kernels live in
//! [`cpu::kernels`] as plain functions over slices. [`quant`] holds ggml's
//! block-quantized weight formats.

pub mod cpu;
pub mod cuda;
pub mod quant;
