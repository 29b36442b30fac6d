//! mllm-ops: op implementations for mllm-rs backends.
//!
//! [`cpu::CpuBackend`] implements every op; its kernels live in
//! [`cpu::kernels`] as plain functions over slices.

pub mod cpu;
