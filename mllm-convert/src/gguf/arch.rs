//! The GGUF architectures the importer reads, as llama.cpp's converter
//! writes them: tensor names, the Hugging Face model each becomes, and what
//! the converter changed in the weights that the import must undo.

use mllm_core::{Error, Result};

/// One GGUF architecture (`general.architecture`).
#[derive(Debug)]
pub struct GgufArch {
    /// The GGUF name, also the prefix of its metadata keys (`qwen2`).
    pub name: &'static str,
    /// The Hugging Face architecture it becomes (`Qwen2ForCausalLM`).
    pub hf_architecture: &'static str,
    /// The Hugging Face `model_type`.
    pub model_type: &'static str,
    /// Whether llama.cpp stores the q/k projection rows in its interleaved
    /// rotary order (Llama only; the others rotate halves, as Hugging Face
    /// does).
    pub interleaved_rotary: bool,
    /// Whether llama.cpp stores the norm weights as `1 + w` (Gemma, whose
    /// Hugging Face norm multiplies by `1 + w`).
    pub norms_plus_one: bool,
    /// Whether the token embedding is repeated as `output.weight` even
    /// when the model ties them (GPT-2).
    pub copies_tied_head: bool,
    /// The Hugging Face prefix of block `N`'s tensors, before `N`.
    layer_prefix: &'static str,
    /// GGUF tensor stems outside the blocks, with their Hugging Face names.
    globals: &'static [(&'static str, &'static str)],
    /// GGUF tensor parts inside a block, with their Hugging Face names.
    parts: &'static [(&'static str, &'static str)],
}

/// Which rotary projection a tensor is, for the row-order fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rotary {
    /// `attn_q`: rows grouped by the attention heads.
    Query,
    /// `attn_k`: rows grouped by the key/value heads.
    Key,
}

/// A GGUF tensor name translated to Hugging Face.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfTensorName {
    /// The Hugging Face name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// Set for q/k projections stored in the interleaved rotary order.
    pub rotary: Option<Rotary>,
    /// Set for norm weights stored as `1 + w`.
    pub plus_one: bool,
}

const DECODER_GLOBALS: &[(&str, &str)] = &[
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
];

const DECODER_PARTS: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

const QWEN3_PARTS: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// Phi-3 keeps the fused projections: `attn_qkv` and `ffn_up` (gate and up
/// rows, gate first).
const PHI3_PARTS: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_qkv", "self_attn.qkv_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_up", "mlp.gate_up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

const GPT2_GLOBALS: &[(&str, &str)] = &[
    ("token_embd", "transformer.wte"),
    ("position_embd", "transformer.wpe"),
    ("output_norm", "transformer.ln_f"),
    ("output", "lm_head"),
];

/// GPT-2's Conv1D weights, stored `[in, out]` by Hugging Face, are stored
/// `[out, in]` by llama.cpp: the layout of the `.mllm` model already.
const GPT2_PARTS: &[(&str, &str)] = &[
    ("attn_norm", "ln_1"),
    ("attn_qkv", "attn.c_attn"),
    ("attn_output", "attn.c_proj"),
    ("ffn_norm", "ln_2"),
    ("ffn_up", "mlp.c_fc"),
    ("ffn_down", "mlp.c_proj"),
];

const fn decoder(
    name: &'static str,
    hf_architecture: &'static str,
    model_type: &'static str,
    parts: &'static [(&'static str, &'static str)],
) -> GgufArch {
    GgufArch {
        name,
        hf_architecture,
        model_type,
        interleaved_rotary: false,
        norms_plus_one: false,
        copies_tied_head: false,
        layer_prefix: "model.layers.",
        globals: DECODER_GLOBALS,
        parts,
    }
}

/// Every GGUF architecture the importer reads.
pub static ARCHITECTURES: &[GgufArch] = &[
    GgufArch {
        interleaved_rotary: true,
        ..decoder("llama", "LlamaForCausalLM", "llama", DECODER_PARTS)
    },
    decoder("qwen2", "Qwen2ForCausalLM", "qwen2", DECODER_PARTS),
    decoder("qwen3", "Qwen3ForCausalLM", "qwen3", QWEN3_PARTS),
    decoder("phi3", "Phi3ForCausalLM", "phi3", PHI3_PARTS),
    GgufArch {
        norms_plus_one: true,
        ..decoder("gemma", "GemmaForCausalLM", "gemma", DECODER_PARTS)
    },
    GgufArch {
        copies_tied_head: true,
        layer_prefix: "transformer.h.",
        globals: GPT2_GLOBALS,
        ..decoder("gpt2", "GPT2LMHeadModel", "gpt2", GPT2_PARTS)
    },
];

/// The architecture named `name` in `general.architecture`.
pub fn find(name: &str) -> Result<&'static GgufArch> {
    ARCHITECTURES
        .iter()
        .find(|a| a.name == name)
        .ok_or_else(|| {
            let known: Vec<&str> = ARCHITECTURES.iter().map(|a| a.name).collect();
            Error::UnsupportedArchitecture(format!(
                "{name} (GGUF general.architecture; this build imports {})",
                known.join(", ")
            ))
        })
}

impl GgufArch {
    /// The metadata key `<arch>.<key>`.
    pub fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.name)
    }

    /// Translates a GGUF tensor name to its Hugging Face name.
    ///
    /// `blocks` is the layer count: a `blk.N.` prefix with `N >= blocks` is
    /// an error, and so is any name that is not part of this architecture
    /// (for example `rope_freqs.weight`, the precomputed rotary factors of
    /// Llama 3.1, which the Hugging Face config cannot express).
    pub fn hf_tensor_name(&self, gguf_name: &str, blocks: u64) -> Result<HfTensorName> {
        let unknown = || {
            Error::InvalidInput(format!(
                "GGUF tensor '{gguf_name}' has no counterpart in a Hugging Face {} model",
                self.hf_architecture
            ))
        };
        let (stem, suffix) = match gguf_name.rsplit_once('.') {
            Some((stem, s @ ("weight" | "bias"))) => (stem, s),
            _ => return Err(unknown()),
        };
        if stem.starts_with("rope_factors") || stem == "rope_freqs" {
            return Err(Error::InvalidInput(format!(
                "GGUF tensor '{gguf_name}' (precomputed rotary frequency factors) is not supported"
            )));
        }
        let plus_one = self.norms_plus_one && suffix == "weight" && stem.ends_with("norm");
        if let Some((_, hf)) = self.globals.iter().find(|(g, _)| *g == stem) {
            return Ok(HfTensorName {
                name: format!("{hf}.{suffix}"),
                rotary: None,
                plus_one,
            });
        }
        let rest = stem.strip_prefix("blk.").ok_or_else(unknown)?;
        let (layer, part) = rest.split_once('.').ok_or_else(unknown)?;
        let layer: u64 = layer
            .parse()
            .ok()
            .filter(|l: &u64| l.to_string() == layer)
            .ok_or_else(unknown)?;
        if layer >= blocks {
            return Err(Error::InvalidInput(format!(
                "GGUF tensor '{gguf_name}' belongs to layer {layer}, but {} is {blocks}",
                self.key("block_count")
            )));
        }
        let (_, hf) = self
            .parts
            .iter()
            .find(|(p, _)| *p == part)
            .ok_or_else(unknown)?;
        let rotary = match part {
            "attn_q" if self.interleaved_rotary => Some(Rotary::Query),
            "attn_k" if self.interleaved_rotary => Some(Rotary::Key),
            _ => None,
        };
        Ok(HfTensorName {
            name: format!("{}{layer}.{hf}.{suffix}", self.layer_prefix),
            rotary,
            plus_one,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hf(arch: &str, name: &str) -> HfTensorName {
        find(arch).unwrap().hf_tensor_name(name, 2).unwrap()
    }

    #[test]
    fn names_follow_each_architecture() {
        let q = hf("llama", "blk.1.attn_q.weight");
        assert_eq!(q.name, "model.layers.1.self_attn.q_proj.weight");
        assert_eq!(q.rotary, Some(Rotary::Query));
        assert_eq!(hf("llama", "blk.0.attn_k.weight").rotary, Some(Rotary::Key));
        let q = hf("qwen2", "blk.0.attn_q.bias");
        assert_eq!(q.name, "model.layers.0.self_attn.q_proj.bias");
        assert_eq!(q.rotary, None);
        assert_eq!(
            hf("qwen3", "blk.0.attn_k_norm.weight").name,
            "model.layers.0.self_attn.k_norm.weight"
        );
        assert_eq!(
            hf("phi3", "blk.1.ffn_up.weight").name,
            "model.layers.1.mlp.gate_up_proj.weight"
        );
        assert_eq!(
            hf("phi3", "blk.1.attn_qkv.weight").name,
            "model.layers.1.self_attn.qkv_proj.weight"
        );
        assert_eq!(
            hf("gpt2", "position_embd.weight").name,
            "transformer.wpe.weight"
        );
        assert_eq!(
            hf("gpt2", "blk.1.attn_qkv.bias").name,
            "transformer.h.1.attn.c_attn.bias"
        );
        assert_eq!(hf("gpt2", "output_norm.bias").name, "transformer.ln_f.bias");
    }

    #[test]
    fn only_gemma_norm_weights_are_stored_plus_one() {
        for name in [
            "blk.0.attn_norm.weight",
            "blk.1.ffn_norm.weight",
            "output_norm.weight",
        ] {
            assert!(hf("gemma", name).plus_one, "{name}");
            assert!(!hf("llama", name).plus_one, "{name}");
        }
        assert!(!hf("gemma", "blk.0.attn_q.weight").plus_one);
        assert!(!hf("gemma", "token_embd.weight").plus_one);
    }

    #[test]
    fn foreign_names_and_layers_are_errors() {
        let qwen2 = find("qwen2").unwrap();
        let msg = qwen2
            .hf_tensor_name("blk.2.attn_q.weight", 2)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("layer 2") && msg.contains("qwen2.block_count is 2"),
            "{msg}"
        );
        let msg = qwen2
            .hf_tensor_name("blk.0.attn_q_norm.weight", 2)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("Qwen2ForCausalLM"), "{msg}");
        let msg = find("phi3")
            .unwrap()
            .hf_tensor_name("rope_factors_long.weight", 2)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("rotary frequency factors"), "{msg}");
        let msg = find("mamba").unwrap_err().to_string();
        assert!(
            msg.contains("mamba") && msg.contains("llama, qwen2, qwen3, phi3, gemma, gpt2"),
            "{msg}"
        );
    }
}
