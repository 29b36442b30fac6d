//! The `bench` example: llama-bench-style JSON for a test after a cache
//! filled to a depth, and the per-op profile of its timed steps.

mod common;

use std::process::Command;

use common::*;
use mllm::core::DType;

/// `-d` fills the cache before every repetition (untimed); the JSON names
/// the depth and the test, and `--profile` sums only the timed steps: the
/// ops of one repetition cannot have run longer than the repetition, which
/// they would with the 300-token fill counted.
#[test]
fn bench_times_a_test_at_depth_and_profiles_its_timed_steps() {
    let model = convert_to(&fixture("tiny-llama"), DType::F32);
    let out = Command::new(example("bench"))
        .args(["-m", model.path.to_str().unwrap()])
        .args(["-p", "0", "-n", "4", "-d", "300", "-r", "2", "-t", "2"])
        .args(["--json", "--profile"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let tests = json.as_array().unwrap();
    assert_eq!(tests.len(), 1, "{stdout}");
    let test = &tests[0];
    assert_eq!(test["n_depth"], 300);
    assert_eq!(test["n_gen"], 4);
    assert_eq!(test["n_prompt"], 0);
    let samples = test["samples_ts"].as_array().unwrap();
    assert_eq!(samples.len(), 2);
    assert!(
        samples.iter().all(|s| s.as_f64().unwrap() > 0.0),
        "{stdout}"
    );

    let header = stderr
        .lines()
        .position(|l| l == "profile of tg4 @ d300 (2 runs):")
        .unwrap_or_else(|| panic!("no profile header in {stderr}"));
    let rows: Vec<(&str, f64)> = stderr
        .lines()
        .skip(header + 1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let ms = words.iter().position(|&w| w == "ms").unwrap();
            (words[0], words[ms - 1].parse().unwrap())
        })
        .collect();
    assert!(
        rows.iter().any(|&(kind, _)| kind == "attention"),
        "{stderr}"
    );
    assert!(rows.iter().any(|&(kind, _)| kind == "linear"), "{stderr}");
    let profiled_ms: f64 = rows.iter().map(|&(_, ms)| ms).sum();
    let run_ms = test["avg_ns"].as_f64().unwrap() / 1e6;
    assert!(
        profiled_ms <= run_ms,
        "ops {profiled_ms} ms a run against {run_ms} ms timed: {stderr}"
    );
}
