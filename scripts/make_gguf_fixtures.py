#!/usr/bin/env python3
"""Writes the GGUF fixtures in tests/fixtures/gguf/ from the tiny Hugging Face
fixtures, the way llama.cpp's converter lays such a model out.

For each model: `<name>.f32.gguf` (every tensor f32), `<name>.q8_0.gguf`
(matrices in Q8_0, norms f32) and `<name>.vocab.gguf` (the metadata
alone, no tensors, like llama.cpp's vocab-only files). Llama's q and k projections are stored in
llama.cpp's interleaved rotary order (its conversion permutes them); the
importer must undo that for the logits to match the reference.

The tiny fixtures carry no tokenizer, so each file gets a byte-level BPE
vocabulary of the model's 256 ids: ids 0-2 are <unk>, <s>, </s>; ids 3-249
are the bytes 3-249 in GPT-2's byte-to-character mapping; the bytes
250-255 (never valid in UTF-8) give their ids to six merged tokens.

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


def interleave_rotary(w: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotate-half row order within each head -> llama.cpp's pairs."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_tensors(weights: dict[str, np.ndarray], cfg: dict) -> list[tuple[str, np.ndarray]]:
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = [("token_embd.weight", weights["model.embed_tokens.weight"])]
    hf_to_gguf = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for layer in range(cfg["num_hidden_layers"]):
        for hf, name in hf_to_gguf.items():
            w = weights[f"model.layers.{layer}.{hf}.weight"]
            if name == "attn_q":
                w = interleave_rotary(w, heads)
            elif name == "attn_k":
                w = interleave_rotary(w, kv_heads)
            out.append((f"blk.{layer}.{name}.weight", w))
    out.append(("output_norm.weight", weights["model.norm.weight"]))
    if "lm_head.weight" in weights and not cfg.get("tie_word_embeddings", False):
        out.append(("output.weight", weights["lm_head.weight"]))
    return out


def write_llama(name: str, qtype: gguf.GGMLQuantizationType | None, vocab_only: bool = False) -> Path:
    src = FIXTURES / name
    cfg = json.loads((src / "config.json").read_text())
    weights = {k: v.astype(np.float32) for k, v in load_file(src / "model.safetensors").items()}
    suffix = "vocab" if vocab_only else "f32" if qtype is None else qtype.name.lower()
    path = OUT / f"{name}.{suffix}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w.add_name(name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype is None else gguf.LlamaFileType.MOSTLY_Q8_0)
    tokens, types, merges = vocabulary()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for tensor_name, data in [] if vocab_only else llama_tensors(weights, cfg):
        if qtype is not None and data.ndim == 2:
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
    for qtype, vocab_only in ((None, False), (gguf.GGMLQuantizationType.Q8_0, False), (None, True)):
        path = write_llama("tiny-llama", qtype, vocab_only)
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
