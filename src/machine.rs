//! What a benchmark reports about the machine it ran on: the CPU's name
//! and the kernel level the quantized and float kernels chose on it.

use crate::ops::cpu::kernels::{QuantKernel, QuantPath, SimdLevel};

/// The fastest level, the default cap.
const NO_CAP: SimdLevel = SimdLevel::FASTEST_FIRST[0];

/// The CPU's model name (`model name` in `/proc/cpuinfo`) with its family
/// and model numbers where the system gives them, e.g. `AMD EPYC (family
/// 25, model 1)`: a virtual machine's name often leaves out which
/// generation it is (Zen 3 and Zen 4 are both `AMD EPYC`). `None` where
/// the system does not say.
pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    cpu_model_of(&info)
}

/// The first processor's `model name` of a `/proc/cpuinfo` text, followed
/// by its `cpu family` and `model` when both are listed.
fn cpu_model_of(cpuinfo: &str) -> Option<String> {
    let first = cpuinfo.split("\n\n").next().unwrap_or_default();
    let field = |name: &str| {
        first.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_string())
        })
    };
    let name = field("model name")?;
    Some(match (field("cpu family"), field("model")) {
        (Some(family), Some(model)) => format!("{name} (family {family}, model {model})"),
        _ => name,
    })
}

/// The instruction set the CPU backend's linear kernels use on this
/// machine for `path` under the cap `max_simd` (`None`: the fastest one it
/// detects).
pub fn kernel_level(path: QuantPath, max_simd: Option<SimdLevel>) -> SimdLevel {
    QuantKernel::capped(path, max_simd.unwrap_or(NO_CAP)).level()
}

/// One line naming the CPU, its core count and the kernel levels of the
/// integer (`path`) and float paths under the cap `max_simd`, e.g. `CPU:
/// AMD EPYC, 2 threads available; kernels: avx512 (quantized), avx512
/// (f32)`.
pub fn describe(path: QuantPath, max_simd: Option<SimdLevel>) -> String {
    let cpu = cpu_model().unwrap_or_else(|| "unknown CPU".to_string());
    let threads = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "CPU: {cpu}, {threads} threads available; kernels: {} (quantized), {} (f32)",
        kernel_level(path, max_simd),
        kernel_level(QuantPath::F32Activations, max_simd)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_name_is_the_first_one_listed() {
        let info = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n\
                    flags\t\t: fpu avx2\n\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(cpu_model_of(info).as_deref(), Some("AMD EPYC 9R14"));
        assert_eq!(cpu_model_of("processor\t: 0\nflags\t: fpu\n"), None);
    }

    #[test]
    fn the_family_and_model_follow_the_name() {
        let info = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n\
                    model\t\t: 1\nmodel name\t: AMD EPYC\nstepping\t: 1\n\n\
                    processor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n";
        assert_eq!(
            cpu_model_of(info).as_deref(),
            Some("AMD EPYC (family 25, model 1)")
        );
        // Without the model number the name stands alone.
        let no_model = "processor\t: 0\ncpu family\t: 6\nmodel name\t: Xeon\n\n\
                        processor\t: 1\nmodel\t\t: 143\n";
        assert_eq!(cpu_model_of(no_model).as_deref(), Some("Xeon"));
    }

    #[test]
    fn the_description_names_the_levels_this_cpu_runs() {
        let line = describe(QuantPath::Int16Activations, None);
        let level = kernel_level(QuantPath::Int16Activations, None);
        assert!(level.is_available(QuantPath::Int16Activations));
        assert!(line.contains(&format!("{level} (quantized)")), "{line}");
        assert!(line.starts_with("CPU: "), "{line}");
        let capped = describe(QuantPath::Int16Activations, Some(SimdLevel::Scalar));
        assert!(
            capped.ends_with("kernels: scalar (quantized), scalar (f32)"),
            "{capped}"
        );
    }
}
