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

/// `--profile-nodes` lists every node of the graph once, in graph order,
/// with its kind and time per run, and the nodes' times add up to the
/// per-kind table printed above them.
#[test]
fn bench_profiles_every_node() {
    let model = convert_to(&fixture("tiny-llama"), DType::F32);
    let out = Command::new(example("bench"))
        .args(["-m", model.path.to_str().unwrap()])
        .args(["-p", "0", "-n", "4", "-r", "2", "-t", "2"])
        .arg("--profile-nodes")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    let section = |header: &str| -> Vec<Vec<&str>> {
        let at = lines
            .iter()
            .position(|&l| l == header)
            .unwrap_or_else(|| panic!("no '{header}' in {stderr}"));
        lines[at + 1..]
            .iter()
            .take_while(|l| l.starts_with("  "))
            .map(|l| l.split_whitespace().collect())
            .collect()
    };
    let kinds = section("profile of tg4 (2 runs):");
    let nodes = section("nodes of tg4, ms per run:");
    let names: Vec<&str> = nodes.iter().map(|n| n[3]).collect();
    assert_eq!(names.first(), Some(&"model.embed_tokens"), "{stderr}");
    assert!(
        nodes
            .iter()
            .any(|n| n[2] == "attention" && n[3] == "model.layers.0.self_attn.attn"),
        "{stderr}"
    );
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "a node listed twice: {stderr}");
    for kind in &kinds {
        let (name, count, ms) = (kind[0], kind[1], kind[3]);
        let of_kind: Vec<f64> = nodes
            .iter()
            .filter(|n| n[2] == name)
            .map(|n| n[0].parse().unwrap())
            .collect();
        assert_eq!(of_kind.len().to_string(), count, "{name}: {stderr}");
        let sum: f64 = of_kind.iter().sum();
        let want: f64 = ms.parse().unwrap();
        // Each printed time is rounded to a microsecond.
        let slack = 0.0005 * (of_kind.len() + 1) as f64;
        assert!(
            (sum - want).abs() <= slack,
            "{name}: nodes {sum} ms, kind {want} ms"
        );
    }
}
