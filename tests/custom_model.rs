//! The `custom_model` example: a model defined outside the library, loaded
//! with `Model::load_with`. Its printed logits equal an independent float64
//! computation of the model's math from the weights in the file it wrote,
//! and its greedy ids are the argmax of those reference logits.

mod common;

use std::collections::HashMap;
use std::process::Command;

use common::*;
use mllm::core::file::{is_metadata_entry, MllmFile};
use mllm::core::DType;

/// The example's weights, as f64, by name.
struct Weights(HashMap<String, Vec<f64>>);

impl Weights {
    fn read(file: &MllmFile) -> Weights {
        let map = file
            .entries()
            .keys()
            .filter(|name| !is_metadata_entry(name))
            .map(|name| {
                let t = file.tensor(name).unwrap();
                assert_eq!(t.dtype(), DType::F32, "{name}");
                let values = t
                    .bytes()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
                    .collect();
                (name.clone(), values)
            })
            .collect();
        Weights(map)
    }

    fn get(&self, name: &str) -> &[f64] {
        &self.0[&format!("{name}.weight")]
    }
}

fn rms(x: &[f64], w: &[f64]) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + 1e-5).sqrt();
    x.iter().zip(w).map(|(v, w)| v * r * w).collect()
}

/// `W x` for `W` stored `[rows, x.len()]`.
fn matvec(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

/// Rotate-half RoPE of every `head_dim` chunk of `x` at `pos`, theta 1e4.
fn rope(x: &mut [f64], pos: usize, head_dim: usize) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for j in 0..half {
            let angle = pos as f64 * 10000f64.powf(-2.0 * j as f64 / head_dim as f64);
            let (a, b) = (head[j], head[j + half]);
            head[j] = a * angle.cos() - b * angle.sin();
            head[j + half] = b * angle.cos() + a * angle.sin();
        }
    }
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

/// Logits of every position of `tokens` for the example's model: 16 hidden,
/// 2 query heads and 1 kv head of 8, GeGLU width 32 (dims read from shapes).
fn reference_logits(w: &Weights, tokens: &[u32]) -> Vec<Vec<f64>> {
    let (head_dim, heads) = (8, 2);
    let hidden = w.get("final_norm").len();
    let embed = w.get("embed");
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| embed[t as usize * hidden..(t as usize + 1) * hidden].to_vec())
        .collect();
    let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
    for (pos, x) in xs.iter().enumerate() {
        let h = rms(x, w.get("block.attn_norm"));
        let mut q = matvec(w.get("block.q"), &h);
        let mut k = matvec(w.get("block.k"), &h);
        rope(&mut q, pos, head_dim);
        rope(&mut k, pos, head_dim);
        qs.push(q);
        ks.push(k);
        vs.push(matvec(w.get("block.v"), &h));
    }
    let mut logits = Vec::new();
    for (t, x) in xs.iter_mut().enumerate() {
        let mut a = vec![0.0; heads * head_dim];
        for hd in 0..heads {
            let q = &qs[t][hd * head_dim..(hd + 1) * head_dim];
            // Both query heads read the single kv head.
            let scores: Vec<f64> = (0..=t)
                .map(|s| {
                    let dot: f64 = q.iter().zip(&ks[s]).map(|(a, b)| a * b).sum();
                    dot / (head_dim as f64).sqrt()
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for (s, p) in e.iter().enumerate() {
                for d in 0..head_dim {
                    a[hd * head_dim + d] += p / sum * vs[s][d];
                }
            }
        }
        for (xi, oi) in x.iter_mut().zip(matvec(w.get("block.o"), &a)) {
            *xi += oi;
        }
        let h = rms(x, w.get("block.mlp_norm"));
        let gate = matvec(w.get("block.gate"), &h);
        let up = matvec(w.get("block.up"), &h);
        let m: Vec<f64> = gate
            .iter()
            .zip(&up)
            .map(|(g, u)| gelu_tanh(*g) * u)
            .collect();
        for (xi, di) in x.iter_mut().zip(matvec(w.get("block.down"), &m)) {
            *xi += di;
        }
        logits.push(matvec(w.get("head"), &rms(x, w.get("final_norm"))));
    }
    logits
}

/// Index of the largest value and its lead over the second largest.
fn argmax_and_margin(row: &[f64]) -> (usize, f64) {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    (idx[0], row[idx[0]] - row[idx[1]])
}

#[test]
fn custom_model_matches_an_independent_computation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("custom.mllm");
    let prompt = [3u32, 1, 4, 1, 5, 9, 2, 6];
    let steps = 6;
    let prompt_arg: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let out = Command::new(example("custom_model"))
        .args(["--out", path.to_str().unwrap()])
        .args(["--prompt-ids", &prompt_arg.join(",")])
        .args(["--steps", &steps.to_string()])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let printed: Vec<Vec<f32>> = (0..steps)
        .map(|k| {
            let prefix = format!("logits {k}: ");
            let line = stdout
                .lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .unwrap_or_else(|| panic!("no '{prefix}' line in {stdout}"));
            line.split(',').map(|v| v.parse().unwrap()).collect()
        })
        .collect();
    let ids: Vec<u32> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ids: "))
        .unwrap()
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), steps);

    let file = MllmFile::open(&path).unwrap();
    assert_eq!(file.metadata().unwrap().architecture, "TinyCustomLm");
    let weights = Weights::read(&file);
    let mut tokens = prompt.to_vec();
    tokens.extend_from_slice(&ids[..steps - 1]);
    let reference = reference_logits(&weights, &tokens);
    for k in 0..steps {
        let want = &reference[prompt.len() - 1 + k];
        let want32: Vec<f32> = want.iter().map(|&v| v as f32).collect();
        // f32 kernels against f64 math on a one-block model: measured 1.8e-7.
        assert_close(&format!("step {k} logits"), &printed[k], &want32, 1e-5);
        let (best, margin) = argmax_and_margin(want);
        assert!(
            margin > 1e-3,
            "step {k}: reference margin {margin} too small"
        );
        assert_eq!(ids[k] as usize, best, "step {k} greedy id");
    }
}
