#!/usr/bin/env python3
"""Writes the GGUF fixtures in tests/fixtures/gguf/ from the tiny Hugging Face
fixtures, the way llama.cpp's converter lays such a model out.

For each of tiny-llama, tiny-qwen2, tiny-qwen3, tiny-phi3, tiny-gemma and
tiny-gpt2: `<name>.f32.gguf` (every tensor f32) and `<name>.q8_0.gguf`
(matrices in Q8_0, norms and biases f32, GPT-2's position table f16); for
tiny-llama also `.q5_0.gguf` and `.q5_1.gguf`; for tiny-llama and
tiny-gemma also `<name>.vocab.gguf` (the metadata alone, no
tensors, like llama.cpp's vocab-only files). What llama.cpp's converter
changes is changed here too, for the importer to undo: Llama's q and k
projections are stored in the interleaved rotary order, Gemma's norm
weights as 1 + w, GPT-2's Conv1D weights transposed to [out, in] with the
token embedding repeated as `output.weight`; Phi-3 keeps its fused
`attn_qkv` and `ffn_up` (gate and up).

The tiny fixtures carry no tokenizer, so each file gets a vocabulary of the
model's 256 ids. Gemma's is a SentencePiece one (`SPM_PIECES` with scores,
byte-fallback tokens); the others a byte-level BPE: ids 0-2 are <unk>, <s>,
</s>; ids 3-249 are the bytes 3-249 in GPT-2's byte-to-character mapping;
the bytes 250-255 (never valid in UTF-8) give their ids to six merged
tokens.

Needs numpy, safetensors and gguf (gguf-py, pinned below):
    python -m pip install numpy safetensors gguf==0.19.0
    python scripts/make_gguf_fixtures.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
OUT = FIXTURES / "gguf"

MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r")]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def byte_to_char() -> dict[int, str]:
    """GPT-2's reversible mapping of bytes to printable characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    chars = byte_to_char()
    tokens = ["<unk>", "<s>", "</s>"] + [chars[b] for b in range(3, 250)]
    tokens += [a + b for a, b in MERGES]
    assert len(tokens) == 256
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * 253
    return tokens, [int(t) for t in types], [f"{a} {b}" for a, b in MERGES]


# Pieces of the SentencePiece vocabulary after its four specials, best
# score first: whole words, then pairs, then single characters.
SPM_PIECES = [
    "▁the", "▁winter", "▁is", "▁coming", "▁a", "▁in", "▁t", "▁w", "he", "in", "er", "an",
    "on", "is", "ing", "▁", *"abcdefghijklmnopqrstuvwxyz", *",.!?'",
]


def spm_vocabulary() -> tuple[list[str], list[float], list[int]]:
    """<pad> <eos> <bos> <unk>, the pieces (scores falling from 0), then byte
    tokens <0x00>, <0x01>, ... for the ids that are left."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + SPM_PIECES
    scores = [0.0] * 4 + [-float(i) for i in range(len(SPM_PIECES))]
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.UNKNOWN]
    types += [gguf.TokenType.NORMAL] * len(SPM_PIECES)
    byte_count = 256 - len(tokens)
    tokens += [f"<0x{b:02X}>" for b in range(byte_count)]
    scores += [0.0] * byte_count
    types += [gguf.TokenType.BYTE] * byte_count
    assert len(tokens) == 256 and len(set(tokens)) == 256
    return tokens, scores, [int(t) for t in types]


def interleave_rotary(w: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotate-half row order within each head -> llama.cpp's pairs."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


DECODER_PARTS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
GPT2_PARTS = {
    "ln_1": "attn_norm",
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_output",
    "ln_2": "ffn_norm",
    "mlp.c_fc": "ffn_up",
    "mlp.c_proj": "ffn_down",
}
GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def decoder_tensors(arch: str, weights: dict[str, np.ndarray], cfg: dict) -> list[tuple[str, np.ndarray]]:
    """llama.cpp's names for a Llama-like decoder; Llama's q/k rows
    interleaved, Gemma's norm weights stored as 1 + w (as its converter does)."""
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    fix_norm = (lambda w: w + 1.0) if arch == "gemma" else (lambda w: w)
    out = [("token_embd.weight", weights["model.embed_tokens.weight"])]
    for layer in range(cfg["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        for key in sorted(k for k in weights if k.startswith(prefix)):
            part, suffix = key[len(prefix):].rsplit(".", 1)
            name, w = DECODER_PARTS[part], weights[key]
            if arch == "llama" and name == "attn_q":
                w = interleave_rotary(w, heads)
            elif arch == "llama" and name == "attn_k":
                w = interleave_rotary(w, kv_heads)
            elif name.endswith("norm"):
                w = fix_norm(w)
            out.append((f"blk.{layer}.{name}.{suffix}", w))
    out.append(("output_norm.weight", fix_norm(weights["model.norm.weight"])))
    if "lm_head.weight" in weights and not cfg.get("tie_word_embeddings", False):
        out.append(("output.weight", weights["lm_head.weight"]))
    return out


def gpt2_tensors(weights: dict[str, np.ndarray], cfg: dict) -> list[tuple[str, np.ndarray]]:
    """llama.cpp's names for GPT-2: Conv1D weights transposed to [out, in],
    and the token embedding repeated as the output head."""
    out = [
        ("token_embd.weight", weights["transformer.wte.weight"]),
        ("position_embd.weight", weights["transformer.wpe.weight"]),
        ("output_norm.weight", weights["transformer.ln_f.weight"]),
        ("output_norm.bias", weights["transformer.ln_f.bias"]),
    ]
    for layer in range(cfg["n_layer"]):
        prefix = f"transformer.h.{layer}."
        for key in sorted(k for k in weights if k.startswith(prefix)):
            part, suffix = key[len(prefix):].rsplit(".", 1)
            w = weights[key]
            if key.endswith(GPT2_CONV1D):
                w = np.ascontiguousarray(w.T)
            out.append((f"blk.{layer}.{GPT2_PARTS[part]}.{suffix}", w))
    out.append(("output.weight", weights["transformer.wte.weight"]))
    return out


def add_decoder_metadata(w: gguf.GGUFWriter, arch: str, cfg: dict) -> None:
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    if "head_dim" in cfg:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_dimension_count(int(head_dim * cfg.get("partial_rotary_factor", 1.0)))
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    if arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(cfg["original_max_position_embeddings"])


def add_gpt2_metadata(w: gguf.GGUFWriter, cfg: dict) -> None:
    w.add_context_length(cfg["n_positions"])
    w.add_embedding_length(cfg["n_embd"])
    w.add_block_count(cfg["n_layer"])
    w.add_feed_forward_length(cfg.get("n_inner") or 4 * cfg["n_embd"])
    w.add_head_count(cfg["n_head"])
    w.add_layer_norm_eps(float(cfg["layer_norm_epsilon"]))


def add_bpe_vocabulary(w: gguf.GGUFWriter, pre: str) -> None:
    tokens, types, merges = vocabulary()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)


def add_spm_vocabulary(w: gguf.GGUFWriter) -> None:
    """A SentencePiece vocabulary as llama.cpp writes Gemma's: four
    specials, the pieces of SPM_PIECES with scores, then byte tokens."""
    tokens, scores, types = spm_vocabulary()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_pad_token_id(0)
    w.add_eos_token_id(1)
    w.add_bos_token_id(2)
    w.add_unk_token_id(3)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)


# (GGUF architecture, tokenizer) of each fixture; "spm" is the SentencePiece
# vocabulary, anything else the byte-level BPE with that pre-tokenizer.
MODELS = {
    "tiny-llama": ("llama", "smollm"),
    "tiny-qwen2": ("qwen2", "qwen2"),
    "tiny-qwen3": ("qwen3", "qwen2"),
    "tiny-phi3": ("phi3", "gpt2"),
    "tiny-gemma": ("gemma", "spm"),
    "tiny-gpt2": ("gpt2", "gpt2"),
}


def write_model(name: str, qtype: gguf.GGMLQuantizationType | None, vocab_only: bool = False) -> Path:
    arch, tokenizer = MODELS[name]
    src = FIXTURES / name
    cfg = json.loads((src / "config.json").read_text())
    weights = {k: v.astype(np.float32) for k, v in load_file(src / "model.safetensors").items()}
    suffix = "vocab" if vocab_only else "f32" if qtype is None else qtype.name.lower()
    path = OUT / f"{name}.{suffix}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    if arch == "gpt2":
        add_gpt2_metadata(w, cfg)
        tensors = gpt2_tensors(weights, cfg)
    else:
        add_decoder_metadata(w, arch, cfg)
        tensors = decoder_tensors(arch, weights, cfg)
    w.add_vocab_size(cfg["vocab_size"])
    file_types = {
        None: gguf.LlamaFileType.ALL_F32,
        gguf.GGMLQuantizationType.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
        gguf.GGMLQuantizationType.Q5_0: gguf.LlamaFileType.MOSTLY_Q5_0,
        gguf.GGMLQuantizationType.Q5_1: gguf.LlamaFileType.MOSTLY_Q5_1,
    }
    w.add_file_type(file_types[qtype])
    if tokenizer == "spm":
        add_spm_vocabulary(w)
    else:
        add_bpe_vocabulary(w, tokenizer)
    w.add_chat_template(CHAT_TEMPLATE)
    for tensor_name, data in [] if vocab_only else tensors:
        if tensor_name == "position_embd.weight" and qtype is not None:
            # Position tables stay float, in f16 as the .mllm converter stores them.
            w.add_tensor(tensor_name, data.astype(np.float16))
        elif qtype is not None and data.ndim == 2:
            w.add_tensor(tensor_name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(tensor_name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    runs = [(name, qtype, False) for name in MODELS
            for qtype in (None, gguf.GGMLQuantizationType.Q8_0)]
    runs += [("tiny-llama", gguf.GGMLQuantizationType.Q5_0, False),
             ("tiny-llama", gguf.GGMLQuantizationType.Q5_1, False)]
    runs += [("tiny-llama", None, True), ("tiny-gemma", None, True)]
    for name, qtype, vocab_only in runs:
        path = write_model(name, qtype, vocab_only)
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
