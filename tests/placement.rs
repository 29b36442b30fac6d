//! Device placement: a model split over two devices (a second CPU backend
//! instance standing in for the GPU) gives exactly the single-device
//! results, with the copies at the device boundaries in the plan; asking
//! for a CUDA device that is not there is a named error.

mod common;

use std::process::Command;

use common::*;
use mllm::core::executor::PlannedCopy;
use mllm::core::file::MllmFile;
use mllm::core::placement::node_layers;
use mllm::core::{Backend, Device, Executor, Graph, Placement};
use mllm::models::registry;
use mllm::models::{LoadOptions, Model};
use mllm::ops::cpu::CpuBackend;

/// An executor for `path` over `backends` with the `placement` policy
/// (device 1 standing in for the accelerator).
fn executor(path: &std::path::Path, backends: &[&dyn Backend], placement: Placement) -> Executor {
    let file = MllmFile::open(path).unwrap();
    let meta = file.metadata().unwrap();
    let model = (registry::find(&meta.architecture).unwrap().build)(&meta.config).unwrap();
    let graph = Graph::trace(model.as_ref()).unwrap();
    let nodes = placement.assign(&graph);
    Executor::with_placement(graph, backends, &nodes, &file, 256).unwrap()
}

#[test]
fn a_split_run_equals_the_single_device_run_and_shows_its_copies() {
    let c = convert_to(&fixture("tiny-llama"), mllm::core::DType::F32);
    let (cpu, other) = (CpuBackend::new(2).unwrap(), CpuBackend::new(1).unwrap());
    let mut single = executor(&c.path, &[&cpu], Placement::default());
    assert!(single.copies().is_empty());
    let want = two_sequence_logits(&mut single, 11);

    // The first decoder layer on the second device: copies into it before
    // layer 0, and back out of it after.
    let first_layer = Placement {
        device: Device::Cuda(0),
        layers: Some(1),
    };
    let mut split = executor(&c.path, &[&cpu, &other], first_layer);
    assert_eq!(two_sequence_logits(&mut split, 11), want);
    let copies = split.copies();
    assert!(!copies.is_empty());
    let graph = split.graph();
    let layers = node_layers(graph);
    let layer_of = |name: &str| {
        let i = graph.nodes().iter().position(|n| n.name == name).unwrap();
        layers[i]
    };
    for PlannedCopy { producer, from, to } in &copies {
        // Into layer 0 from the CPU, or out of it back to the CPU.
        let expected = if layer_of(producer) == Some(0) {
            (1, 0)
        } else {
            (0, 1)
        };
        assert_eq!((*from, *to), expected, "{producer}");
        assert!(matches!(layer_of(producer), None | Some(0)), "{producer}");
    }
    assert!(copies.iter().any(|c| c.from == 0));
    assert!(copies.iter().any(|c| c.from == 1));
    for (i, node) in graph.nodes().iter().enumerate() {
        let want = usize::from(layers[i] == Some(0));
        assert_eq!(split.node_device(i), want, "{}", node.name);
    }
    assert_eq!(split.device_names(), ["cpu", "cpu"]);

    // Everything on the second device: the output is copied back once.
    let all = Placement {
        device: Device::Cuda(0),
        layers: None,
    };
    let mut moved = executor(&c.path, &[&cpu, &other], all);
    assert_eq!(two_sequence_logits(&mut moved, 11), want);
    assert_eq!(moved.copies().len(), 1);
}

#[test]
fn a_missing_cuda_device_is_a_named_error() {
    let c = convert_to(&fixture("tiny-llama"), mllm::core::DType::F32);
    let opts = LoadOptions {
        threads: 1,
        placement: Placement {
            device: Device::Cuda(0),
            layers: Some(1),
        },
        ..Default::default()
    };
    let err = Model::load(&c.path, &opts)
        .err()
        .expect("no CUDA here")
        .to_string();
    assert!(
        err.contains("--features cuda")
            || err.contains("libcuda.so")
            || err.contains("no CUDA implementation"),
        "{err}"
    );
    let out = Command::new(example("generate"))
        .args([
            "--model",
            c.path.to_str().unwrap(),
            "--prompt-ids",
            "1,2",
            "--device",
            "cuda:1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cuda:1"), "{stderr}");
    let out = Command::new(example("generate"))
        .args([
            "--model",
            c.path.to_str().unwrap(),
            "--prompt-ids",
            "1",
            "--device",
            "tpu",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown device 'tpu'"));
}
