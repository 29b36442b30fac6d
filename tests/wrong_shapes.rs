//! Files whose tensors do not match their config: a transposed matrix, a
//! vocabulary of the wrong size, a missing layer, an extra layer. Each is
//! an error naming the tensor (or the config key) when the model loads,
//! before any step runs.

mod common;

use common::*;
use mllm::core::file::{MllmFile, MllmWriter, TensorSpec};
use mllm::core::{DType, Error};
use mllm::models::{LoadOptions, Model};

/// tiny-llama (2 layers, hidden 64, FFN 128, vocab 256) rewritten: `edit`
/// may change the config and the list of (name, shape, bytes) tensors.
fn rewritten(
    edit: impl FnOnce(&mut serde_json::Value, &mut Vec<(String, Vec<usize>, Vec<u8>)>),
) -> (Converted, Error) {
    let c = convert_to(&fixture("tiny-llama"), DType::F32);
    let file = MllmFile::open(&c.path).unwrap();
    let mut meta = file.metadata().unwrap().clone();
    let mut tensors: Vec<_> = meta
        .tensors
        .keys()
        .map(|name| {
            let t = file.tensor(name).unwrap();
            (name.clone(), t.shape().dims().to_vec(), t.bytes().to_vec())
        })
        .collect();
    edit(&mut meta.config, &mut tensors);
    meta.tensors = tensors
        .iter()
        .map(|(n, s, _)| (n.clone(), s.clone()))
        .collect();
    let path = c.dir.path().join("edited.mllm");
    let mut w = MllmWriter::new();
    w.metadata(meta);
    for (name, shape, _) in &tensors {
        w.add_tensor(TensorSpec::new(name.clone(), DType::F32, shape.clone()))
            .unwrap();
    }
    w.write(&path, |i, _| Ok(tensors[i].2.clone().into()))
        .unwrap();
    let opts = LoadOptions {
        threads: 1,
        ..Default::default()
    };
    let err = Model::load(&path, &opts)
        .err()
        .expect("the edited file must not load");
    (c, err)
}

fn copy_layer(tensors: &mut Vec<(String, Vec<usize>, Vec<u8>)>, from: usize, to: usize) {
    let prefix = format!("model.layers.{from}.");
    let copies: Vec<_> = tensors
        .iter()
        .filter(|(n, _, _)| n.starts_with(&prefix))
        .map(|(n, s, b)| {
            let name = n.replacen(&prefix, &format!("model.layers.{to}."), 1);
            (name, s.clone(), b.clone())
        })
        .collect();
    tensors.extend(copies);
}

#[test]
fn a_transposed_matrix_is_named() {
    let (_c, err) = rewritten(|_, tensors| {
        let up = tensors
            .iter_mut()
            .find(|(n, _, _)| n == "model.layers.1.mlp.up_proj.weight")
            .unwrap();
        up.1.reverse();
    });
    let msg = err.to_string();
    assert!(
        msg.contains("model.layers.1.mlp.up_proj.weight")
            && msg.contains("[64, 128]")
            && msg.contains("[128, 64]"),
        "{msg}"
    );
}

#[test]
fn an_embedding_of_the_wrong_vocabulary_is_named() {
    let (_c, err) = rewritten(|config, _| config["vocab_size"] = serde_json::json!(300));
    let msg = err.to_string();
    assert!(
        msg.contains("model.embed_tokens.weight") && msg.contains("300"),
        "{msg}"
    );
}

#[test]
fn a_missing_layer_is_named() {
    let (_c, err) = rewritten(|_, tensors| {
        tensors.retain(|(n, _, _)| !n.starts_with("model.layers.1."));
    });
    assert!(
        matches!(&err, Error::MissingTensor(name) if name.starts_with("model.layers.1.")),
        "{err:?}"
    );
}

#[test]
fn an_extra_layer_is_named() {
    let (_c, err) = rewritten(|_, tensors| copy_layer(tensors, 1, 2));
    let msg = err.to_string();
    assert!(msg.contains("model.layers.2."), "{msg}");
}
