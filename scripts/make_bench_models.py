#!/usr/bin/env python3
"""Benchmark GGUF files made locally, with nothing new downloaded.

Usage (from the repository root):
    python3 scripts/make_bench_models.py [--out DIR] [--skip-1b] [--random-smollm2]

Writes into DIR (default: <cache>/bench, the cache of compare_llamacpp.py):
- smollm2-135m.{q4_k_m,q5_k_m,q8_0,f16}.gguf: the default SmolLM2 GGUF (Q4_1)
  requantized by llama.cpp's own quantizer (`llama_model_quantize` with
  requantization allowed, through scripts/quantize_gguf.py). They hold the
  Q4_1 model's values in other types: right for speed, a little worse in
  perplexity than a quantization of the original weights.
- llama-1b.f16.gguf: a Llama-shaped model of about 1.1B parameters with
  seeded random weights (hidden 2048, 16 layers, 32 query and 8 KV heads of
  64, FFN 8192, SmolLM2's vocabulary of 49152 tokens and its tokenizer
  metadata, tied embeddings), written by gguf-py; and its llama.cpp
  quantizations llama-1b.{q4_k_m,q5_k_m,q8_0}.gguf. Its rows of 2048 are
  whole 256-blocks, so its Q4_K_M is Q4_K and Q6_K (Q5_K_M: Q5_K and
  Q6_K), unlike SmolLM2's (576-wide rows, mostly Q5_0/Q5_1/Q8_0
  fallbacks).

With `--random-smollm2` it also writes smollm2-135m-random.f16.gguf, seeded
random weights in SmolLM2-135M's shapes (576 wide, 30 layers, 9 query
and 3 KV heads, FFN 1536) with its tokenizer, and that file's llama.cpp
quantizations smollm2-135m-random.{q4_1,q4_k_m,q8_0}.gguf: the same
tensor types and sizes as the default file's (within a few hundred bytes
of metadata), for timing on a machine that has only the tokenizer.

Every file is skipped when it exists. gguf-py (pinned below) is installed
into the llama-cpp-python venv that compare_llamacpp.py builds on first
use; that build is `-DGGML_NATIVE=OFF` with this CPU's AVX2/AVX-512/VNNI
levels named one by one and AMX off, since a native build can pick AMX,
which faults in some VMs. Then compare with, for example:
    python3 scripts/compare_llamacpp.py --gguf <DIR>/llama-1b.q4_k_m.gguf
"""
import argparse
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from compare_llamacpp import cache_dir, ensure_venv  # noqa: E402

GGUF_PY = "gguf==0.19.0"
ROOT = pathlib.Path(__file__).resolve().parent.parent

# Shapes of the random models: hidden, layers, query heads, KV heads, FFN.
SHAPES = {"1b": (2048, 16, 32, 8, 8192), "smollm2": (576, 30, 9, 3, 1536)}

# Written by the venv's python: argv = default GGUF (for the vocabulary),
# output, the shape's name, then its five numbers.
WRITE_RANDOM = r"""
import sys
import numpy as np
import gguf

NAME = sys.argv[3]
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = map(int, sys.argv[4:9])
HEAD_DIM = HIDDEN // HEADS
src, dst = sys.argv[1], sys.argv[2]
vocab = gguf.GGUFReader(src)

def field(name):
    f = vocab.fields[name]
    return f.contents()

tokens = field("tokenizer.ggml.tokens")
rng = np.random.default_rng(20261124)

def normal(*shape, std):
    return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float16)

w = gguf.GGUFWriter(dst, "llama")
w.add_name(f"llama-{NAME}-random")
w.add_context_length(8192)
w.add_embedding_length(HIDDEN)
w.add_block_count(LAYERS)
w.add_feed_forward_length(FFN)
w.add_head_count(HEADS)
w.add_head_count_kv(KV_HEADS)
w.add_rope_dimension_count(HEAD_DIM)
w.add_rope_freq_base(100000.0)
w.add_layer_norm_rms_eps(1e-5)
w.add_vocab_size(len(tokens))
w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
w.add_tokenizer_model(field("tokenizer.ggml.model"))
w.add_tokenizer_pre(field("tokenizer.ggml.pre"))
w.add_token_list(tokens)
w.add_token_types(field("tokenizer.ggml.token_type"))
w.add_token_merges(field("tokenizer.ggml.merges"))
for key, add in [("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id),
                 ("unknown", w.add_unk_token_id), ("padding", w.add_pad_token_id)]:
    name = f"tokenizer.ggml.{key}_token_id"
    if name in vocab.fields:
        add(int(field(name)))
w.add_add_bos_token(False)
w.add_chat_template(field("tokenizer.chat_template"))
std = 0.02
w.add_tensor("token_embd.weight", normal(len(tokens), HIDDEN, std=std))
w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
for layer in range(LAYERS):
    p = f"blk.{layer}."
    w.add_tensor(p + "attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor(p + "ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor(p + "attn_q.weight", normal(HIDDEN, HIDDEN, std=std))
    w.add_tensor(p + "attn_k.weight", normal(KV_HEADS * HEAD_DIM, HIDDEN, std=std))
    w.add_tensor(p + "attn_v.weight", normal(KV_HEADS * HEAD_DIM, HIDDEN, std=std))
    w.add_tensor(p + "attn_output.weight", normal(HIDDEN, HIDDEN, std=std))
    w.add_tensor(p + "ffn_gate.weight", normal(FFN, HIDDEN, std=std))
    w.add_tensor(p + "ffn_up.weight", normal(FFN, HIDDEN, std=std))
    w.add_tensor(p + "ffn_down.weight", normal(HIDDEN, FFN, std=std))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
"""


def quantize(src: pathlib.Path, dst: pathlib.Path, kind: str) -> None:
    if dst.exists():
        print(f"have {dst}")
        return
    subprocess.run([sys.executable, str(ROOT / "scripts" / "quantize_gguf.py"), str(src),
                    str(dst), kind], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path, default=cache_dir() / "bench")
    ap.add_argument("--skip-1b", action="store_true", help="only the SmolLM2 files")
    ap.add_argument("--random-smollm2", action="store_true",
                    help="also SmolLM2-shaped files of seeded random weights (see above)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    default = cache_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not default.exists():
        subprocess.run(["cargo", "run", "--release", "-q", "--example", "bench", "--",
                        "-p", "0", "-n", "1", "-r", "1"], check=True, cwd=ROOT)
    for kind in ("q4_k_m", "q5_k_m", "q8_0", "f16"):
        quantize(default, args.out / f"smollm2-135m.{kind}.gguf", kind)
    if args.random_smollm2:
        f16 = write_random(default, args.out / "smollm2-135m-random.f16.gguf", "smollm2")
        for kind in ("q4_1", "q4_k_m", "q8_0"):
            quantize(f16, args.out / f"smollm2-135m-random.{kind}.gguf", kind)
    if args.skip_1b:
        return
    f16 = write_random(default, args.out / "llama-1b.f16.gguf", "1b")
    for kind in ("q4_k_m", "q5_k_m", "q8_0"):
        quantize(f16, args.out / f"llama-1b.{kind}.gguf", kind)


def write_random(default: pathlib.Path, f16: pathlib.Path, shape: str) -> pathlib.Path:
    """Writes `f16` (unless it exists): seeded random F16 weights in the
    shape named `shape` (see SHAPES), with `default`'s tokenizer."""
    if f16.exists():
        print(f"have {f16}")
        return f16
    python = ensure_venv()
    subprocess.run([str(python), "-m", "pip", "install", "-q", GGUF_PY], check=True)
    tmp = f16.with_suffix(".tmp")
    print(f"writing {f16} (seeded random weights)")
    dims = [str(n) for n in SHAPES[shape]]
    subprocess.run([str(python), "-c", WRITE_RANDOM, str(default), str(tmp), shape] + dims,
                   check=True)
    tmp.rename(f16)
    return f16


if __name__ == "__main__":
    main()
