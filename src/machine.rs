//! What a benchmark reports about the machine it ran on: the CPU's name
//! and the kernel level the quantized and float kernels chose on it.

use crate::ops::cpu::kernels::{QuantKernel, QuantPath, SimdLevel};

/// The CPU's model name (`model name` in `/proc/cpuinfo`), or `None`
/// where the system does not say.
pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    model_name(&info)
}

/// The first `model name` value of a `/proc/cpuinfo` text.
fn model_name(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "model name").then(|| value.trim().to_string())
    })
}

/// The instruction set the CPU backend's kernels use on this machine for
/// `path` (the fastest one it detects).
pub fn kernel_level(path: QuantPath) -> SimdLevel {
    QuantKernel::new(path).level()
}

/// One line naming the CPU, its core count and the kernel levels of the
/// integer (`path`) and float paths, e.g. `CPU: AMD EPYC, 2 threads
/// available; kernels: Avx512 (quantized), Avx512 (f32)`.
pub fn describe(path: QuantPath) -> String {
    let cpu = cpu_model().unwrap_or_else(|| "unknown CPU".to_string());
    let threads = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "CPU: {cpu}, {threads} threads available; kernels: {:?} (quantized), {:?} (f32)",
        kernel_level(path),
        kernel_level(QuantPath::F32Activations)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_name_is_the_first_one_listed() {
        let info = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n\
                    flags\t\t: fpu avx2\n\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(model_name(info).as_deref(), Some("AMD EPYC 9R14"));
        assert_eq!(model_name("processor\t: 0\nflags\t: fpu\n"), None);
    }

    #[test]
    fn the_description_names_the_levels_this_cpu_runs() {
        let line = describe(QuantPath::Int16Activations);
        let level = kernel_level(QuantPath::Int16Activations);
        assert!(level.is_available(QuantPath::Int16Activations));
        assert!(line.contains(&format!("{level:?} (quantized)")), "{line}");
        assert!(line.starts_with("CPU: "), "{line}");
    }
}
