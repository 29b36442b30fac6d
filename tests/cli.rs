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

/// tiny-llama as a plain mllm v1 file in `dir`.
fn plain_tiny_llama(dir: &std::path::Path) -> std::path::PathBuf {
    let plain = dir.join("plain.mllm");
    plain_v1::write_plain_v1(
        &fixture("tiny-llama").join("model.safetensors"),
        &plain,
        &[],
    );
    plain
}

/// A plain mllm v1 file (written without the project's writer) runs from
/// the command line with `--config` and gives the reference ids and
/// logits; without `--config` the error names the flag.
#[test]
fn plain_v1_file_runs_with_config_flag() {
    let dir = tempfile::tempdir().unwrap();
    let plain = plain_tiny_llama(dir.path());
    let reference = Reference::load("tiny-llama");
    let prompt: Vec<String> = reference
        .ids("/inputs/long")
        .iter()
        .map(u32::to_string)
        .collect();
    let want: Vec<String> = reference
        .ids("/greedy/long/new_ids")
        .iter()
        .map(u32::to_string)
        .collect();
    let npy = dir.path().join("logits.npy");
    let config = fixture("tiny-llama").join("config.json");
    let run = |extra: &[&str]| {
        Command::new(example("generate"))
            .args(["--model", plain.to_str().unwrap()])
            .args(["--prompt-ids", &prompt.join(",")])
            .args(["--max-tokens", "20", "--print-ids", "--threads", "2"])
            .args(["--dump-logits", npy.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&["--config", config.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let ids_line = format!("ids: {}", want.join(","));
    assert!(stdout.lines().any(|l| l == ids_line), "{stdout}");
    let (shape, data) = read_npy(&npy);
    assert_eq!(shape, vec![prompt.len(), 256]);
    assert_close(
        "plain v1",
        &data,
        &reference.array("logits_long").data,
        1e-4,
    );

    let out = run(&[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("plain mllm v1 file with no embedded metadata")
            && stderr.contains("--config"),
        "{stderr}"
    );
}

/// A config that contradicts the metadata a file embeds is refused with
/// the field that differs; one that agrees is accepted.
#[test]
fn contradicting_config_flag_is_refused() {
    let c = convert_to(&fixture("tiny-llama"), DType::F32);
    let dir = tempfile::tempdir().unwrap();
    let config_path = fixture("tiny-llama").join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    let run = |config: &std::path::Path| {
        Command::new(example("generate"))
            .args(["--model", c.path.to_str().unwrap()])
            .args(["--prompt-ids", "1,2,3", "--max-tokens", "2", "--print-ids"])
            .args(["--config", config.to_str().unwrap()])
            .output()
            .unwrap()
    };
    assert!(run(&config_path).status.success());
    config["num_hidden_layers"] = serde_json::json!(3);
    let wrong = dir.path().join("config.json");
    std::fs::write(&wrong, config.to_string()).unwrap();
    let out = run(&wrong);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("contradicts the metadata")
            && stderr.contains("'num_hidden_layers' is 3 in it and 2 in the file"),
        "{stderr}"
    );
    config["num_hidden_layers"] = serde_json::json!(2);
    config["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
    std::fs::write(&wrong, config.to_string()).unwrap();
    let stderr = String::from_utf8_lossy(&run(&wrong).stderr).into_owned();
    assert!(
        stderr.contains("it names architecture Qwen2ForCausalLM, the file LlamaForCausalLM"),
        "{stderr}"
    );
}

/// `--tokenizer` and `--chat-template` give a plain file what it lacks:
/// the text prompt (and the chat prompt rendered with the given template)
/// becomes the same ids as the equivalent `--prompt-ids` run.
#[test]
fn plain_v1_file_takes_tokenizer_and_template_flags() {
    let dir = tempfile::tempdir().unwrap();
    let plain = plain_tiny_llama(dir.path());
    let tokenizer = dir.path().join("tokenizer.json");
    let vocab = serde_json::json!({"[UNK]": 0, "hello": 5, "world": 7});
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    std::fs::write(&tokenizer, json.to_string()).unwrap();
    let template = dir.path().join("template.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}{{ m.content }} world{% endfor %}",
    )
    .unwrap();
    let config = fixture("tiny-llama").join("config.json");
    let ids_line = |extra: &[&str]| {
        let stdout = stdout_of(
            Command::new(example("generate"))
                .args(["--model", plain.to_str().unwrap()])
                .args(["--config", config.to_str().unwrap()])
                .args(["--max-tokens", "4", "--print-ids", "--threads", "2"])
                .args(extra),
        );
        stdout
            .lines()
            .find(|l| l.starts_with("ids: "))
            .unwrap()
            .to_string()
    };
    let tok = tokenizer.to_str().unwrap();
    let want = ids_line(&["--prompt-ids", "5,7"]);
    assert_eq!(
        ids_line(&["--tokenizer", tok, "--prompt", "hello world"]),
        want
    );
    let chat = [
        "--tokenizer",
        tok,
        "--chat-template",
        template.to_str().unwrap(),
        "--chat",
        "--prompt",
        "hello",
    ];
    assert_eq!(ids_line(&chat), want);
}

/// `generate --beams` prints transformers' beam-search hypotheses, best
/// first, with their scores (the tiny-llama case of
/// `tests/fixtures/beam_search.json` that sets every beam flag).
#[test]
fn generate_with_beams_prints_the_reference_hypotheses() {
    let text = std::fs::read_to_string(fixture("beam_search.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let case = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["model"] == "tiny-llama" && c["early_stopping"] == "never")
        .unwrap();
    assert!(case["eos_ids"].as_array().unwrap().is_empty());
    let arg = |key: &str| case[key].to_string();
    let prompt: Vec<String> = case["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.to_string())
        .collect();
    let c = convert_to(&fixture("tiny-llama"), DType::F32);
    let out = Command::new(example("generate"))
        .args(["--model", c.path.to_str().unwrap()])
        .args(["--prompt-ids", &prompt.join(",")])
        .args(["--max-tokens", &arg("max_new_tokens")])
        .args(["--beams", &arg("num_beams")])
        .args(["--length-penalty", &arg("length_penalty")])
        .args(["--early-stopping", "never"])
        .args(["--num-return", &arg("num_return_sequences")])
        .args(["--ignore-eos", "--print-ids", "--threads", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let results = case["results"].as_array().unwrap();
    assert_eq!(stdout.lines().count(), results.len(), "{stdout}");
    for (i, (line, want)) in stdout.lines().zip(results).enumerate() {
        let (head, ids) = line.split_once(" ids: ").unwrap();
        let score: f64 = head
            .strip_prefix(&format!("beam {i} score "))
            .unwrap()
            .parse()
            .unwrap();
        let want_ids: Vec<String> = want["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.to_string())
            .collect();
        assert_eq!(ids, want_ids.join(","), "{line}");
        let want_score = want["score"].as_f64().unwrap();
        assert!(
            (score - want_score).abs() <= 1e-4 * want_score.abs().max(1.0),
            "{line}"
        );
    }
    assert!(stderr.contains("10 steps of 3 beams"), "{stderr}");

    // Sampling flags do not mix with beams.
    let out = Command::new(example("generate"))
        .args(["--model", c.path.to_str().unwrap(), "--prompt-ids", "1,2"])
        .args(["--beams", "2", "--temperature", "0.7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "error: invalid input: beam search does not sample: --temperature must be 0 with --beams"
    );
}
