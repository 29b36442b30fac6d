//! The `generate` example's stable debugging interface: `--print-ids` and
//! `--dump-logits` reproduce the reference ids and logits.

mod common;

use std::process::Command;

use common::*;
use mllm::core::DType;

/// Reads a little-endian float32 `.npy` file: shape and values.
fn read_npy(path: &std::path::Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(header.contains("'descr': '<f4'"), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let dims = header
        .split("'shape': (")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap();
    let shape = dims
        .split(',')
        .filter(|d| !d.trim().is_empty())
        .map(|d| d.trim().parse().unwrap())
        .collect();
    let data = bytes[10 + hlen..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (shape, data)
}

#[test]
fn generate_prints_ids_and_dumps_logits() {
    for name in ["tiny-llama", "tiny-mistral-swa"] {
        let c = convert_to(&fixture(name), DType::F32);
        let reference = Reference::load(name);
        let prompt = reference.ids("/inputs/long");
        let want = reference.ids("/greedy/long/new_ids");
        let npy = c.dir.path().join("logits.npy");
        let ids_arg: Vec<String> = prompt.iter().map(u32::to_string).collect();
        let out = Command::new(example("generate"))
            .args(["--model", c.path.to_str().unwrap()])
            .args(["--prompt-ids", &ids_arg.join(",")])
            .args(["--max-tokens", "20", "--print-ids", "--threads", "2"])
            .args(["--dump-logits", npy.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        let want_line: Vec<String> = want.iter().map(u32::to_string).collect();
        assert!(
            stdout
                .lines()
                .any(|l| l == format!("ids: {}", want_line.join(","))),
            "{name}: {stdout}"
        );
        let (shape, data) = read_npy(&npy);
        assert_eq!(shape, vec![prompt.len(), 256]);
        assert_close(name, &data, &reference.array("logits_long").data, 1e-4);
    }
}

#[test]
fn generate_reports_errors_without_panicking() {
    let out = Command::new(example("generate"))
        .args(["--model", "/nonexistent/model.mllm", "--prompt-ids", "1,2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: I/O error on /nonexistent/model.mllm"),
        "{stderr}"
    );

    let c = convert_to(&fixture("tiny-llama"), DType::F32);
    let out = Command::new(example("generate"))
        .args(["--model", c.path.to_str().unwrap(), "--prompt", "hello"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("embeds no tokenizer"), "{stderr}");
}
