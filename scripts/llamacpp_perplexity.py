#!/usr/bin/env python3
"""Perplexity of a GGUF under llama.cpp, by the method of the perplexity example.

Usage (from the repository root):
    python3 scripts/llamacpp_perplexity.py MODEL.gguf [--file tests/fixtures/ppl.txt]
        [--ctx 256] [--threads 2]

The text is tokenized without special tokens (no BOS), cut into windows of
--ctx tokens (a shorter last window is dropped), each window is evaluated
from an empty KV cache, and every token after the first of its window is
scored by the log-likelihood llama.cpp gives it: `PPL = exp(mean NLL)`.
That is what `cargo run --release --example perplexity` computes, so the two
numbers compare one file under both engines. Runs in the llama-cpp-python
venv that `compare_llamacpp.py` keeps in the cache (built on first use).
"""
import argparse
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from compare_llamacpp import ensure_venv  # noqa: E402

SCORE = """
import math, sys
import numpy as np
import llama_cpp
model, text, ctx, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
llm = llama_cpp.Llama(model_path=model, n_ctx=ctx, n_batch=ctx, n_threads=threads,
                      logits_all=True, verbose=False)
tokens = llm.tokenize(open(text, "rb").read(), add_bos=False, special=False)
nll, scored = 0.0, 0
for start in range(0, len(tokens) - ctx + 1, ctx):
    window = tokens[start:start + ctx]
    llm.reset()
    llm.eval(window)
    logits = np.asarray(llm.scores[:ctx - 1], dtype=np.float64)
    top = logits.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    nll += float((log_z - logits[np.arange(ctx - 1), window[1:]]).sum())
    scored += ctx - 1
print(f"{len(tokens)} tokens, {scored // (ctx - 1)} windows of {ctx}, {scored} scored")
print(f"PPL {math.exp(nll / scored):.4f}")
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=pathlib.Path)
    ap.add_argument("--file", type=pathlib.Path,
                    default=pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/ppl.txt")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.ctx < 2:
        sys.exit("--ctx must be at least 2")
    python = ensure_venv()
    done = subprocess.run([str(python), "-c", SCORE, str(args.model), str(args.file),
                           str(args.ctx), str(args.threads)])
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
