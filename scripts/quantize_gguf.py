#!/usr/bin/env python3
"""Requantize a GGUF with llama.cpp's own quantizer, for benchmark files.

Usage (from the repository root):
    python3 scripts/quantize_gguf.py IN.gguf OUT.gguf TYPE
        (TYPE: f16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_m, q4_k_m, q5_k_m,
         q6_k, iq4_nl, iq4_xs)

Runs `llama_model_quantize` from the llama-cpp-python build that
`compare_llamacpp.py` keeps in the cache (built on first use), with
requantization allowed: a Q4_1 file requantized to Q8_0 holds the Q4_1
values at 8 bits, which is what a speed comparison needs. The mixes
(q2_k, q3_k_m, q4_k_m, q5_k_m, iq4_xs) are llama.cpp's choice of type per
tensor; where a row is not whole 256-blocks they fall back to
iq4_nl/q5_0/q5_1/q8_0. Example: the
Q8_0 SmolLM2 of BENCHMARKS.md is

    python3 scripts/quantize_gguf.py ~/.cache/mllm-rs/SmolLM2-135M-Instruct.Q4_1.gguf \\
        /tmp/smollm2-q8_0.gguf q8_0
"""
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from compare_llamacpp import ensure_venv  # noqa: E402

# llama.cpp's `llama_ftype` codes of the types offered here.
FTYPES = {"f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9,
          "q2_k": 10, "q3_k_m": 12, "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18, "iq4_nl": 25,
          "iq4_xs": 30}

QUANTIZE = """
import ctypes, sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = int(sys.argv[3])
p.allow_requantize = True
rc = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p))
sys.exit(rc)
"""


def main():
    if len(sys.argv) != 4 or sys.argv[3] not in FTYPES:
        sys.exit(__doc__)
    src, dst, kind = sys.argv[1:]
    python = ensure_venv()
    done = subprocess.run([str(python), "-c", QUANTIZE, src, dst, str(FTYPES[kind])],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if done.returncode != 0:
        sys.exit(f"llama_model_quantize failed with code {done.returncode}")
    print(f"wrote {dst} ({kind})")


if __name__ == "__main__":
    main()
