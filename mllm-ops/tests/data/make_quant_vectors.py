#!/usr/bin/env python3
"""Writes the dequantization test vectors for mllm-ops' quantized formats.

For each of Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, Q5_0, Q5_1, Q5_K, Q2_K, Q3_K,
IQ4_NL and IQ4_XS this makes a few blocks of
random bytes (every bit pattern is a valid block, except that the f16
scales are set to small finite values, one of them subnormal) and
dequantizes them with the reference implementation in the `gguf` Python
package (llama.cpp's gguf-py). It writes, next to this script:

    <type>.blocks   the raw block bytes
    <type>.f32      the expected values, little-endian f32

and, for the formats gguf-py can also quantize (Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1), blocks of random normal values (one block all zero, one constant)
and gguf-py's quantization of them:

    <type>.input      the values, little-endian f32
    <type>.quantized  the expected block bytes

`mllm-ops/tests/quant_formats.rs` checks that `mllm_ops::quant::dequantize`
and `quantize` reproduce them bit for bit.

To regenerate (outside the repository's tree, in a throwaway venv):

    python3 -m venv /tmp/ggufvenv
    /tmp/ggufvenv/bin/pip install gguf numpy
    /tmp/ggufvenv/bin/python mllm-ops/tests/data/make_quant_vectors.py

The output is deterministic for a given seed (vectors were made with
gguf 0.19.0 and numpy 2.4).
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

OUT = Path(__file__).resolve().parent
SEED = 20240601

# name -> (type, number of blocks, byte offsets of the f16 scales in a block)
FORMATS = {
    "q8_0": (T.Q8_0, 4, [0]),
    "q4_0": (T.Q4_0, 4, [0]),
    "q4_1": (T.Q4_1, 4, [0, 2]),
    "q4_k": (T.Q4_K, 2, [0, 2]),
    "q6_k": (T.Q6_K, 2, [208]),
    "q5_0": (T.Q5_0, 4, [0]),
    "q5_1": (T.Q5_1, 4, [0, 2]),
    "q5_k": (T.Q5_K, 2, [0, 2]),
    "q2_k": (T.Q2_K, 2, [80, 82]),
    "q3_k": (T.Q3_K, 2, [108]),
    "iq4_nl": (T.IQ4_NL, 4, [0]),
    "iq4_xs": (T.IQ4_XS, 2, [0]),
}

# The round-to-nearest formats whose quantizer gguf-py implements, with the
# number of blocks of random normal values to quantize.
QUANTIZED = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1}
QUANTIZED_BLOCKS = 8


def small_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """n finite f16 values of either sign between 1e-3 and 1, the first subnormal."""
    mag = np.exp(rng.uniform(np.log(1e-3), 0.0, n))
    sign = rng.choice([-1.0, 1.0], n)
    vals = (mag * sign).astype(np.float16)
    vals[0] = np.float16(3e-6)  # a subnormal f16
    return vals


def main() -> None:
    rng = np.random.default_rng(SEED)
    for name, (qtype, n_blocks, scale_offsets) in FORMATS.items():
        block_len, block_bytes = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
        for off in scale_offsets:
            raw[:, off : off + 2] = small_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
        values = dequantize(raw.reshape(-1), qtype).astype("<f4").reshape(-1)
        assert values.size == n_blocks * block_len and np.all(np.isfinite(values))
        (OUT / f"{name}.blocks").write_bytes(raw.tobytes())
        (OUT / f"{name}.f32").write_bytes(values.tobytes())
        print(f"{name}: {n_blocks} blocks, {raw.nbytes} + {values.nbytes} bytes")
    rng = np.random.default_rng(SEED + 1)
    for name, qtype in QUANTIZED.items():
        values = rng.standard_normal((QUANTIZED_BLOCKS, 32)).astype(np.float32)
        values[1] = 0.0
        values[2] = 0.25
        blocks = quantize(values, qtype)
        (OUT / f"{name}.input").write_bytes(values.astype("<f4").tobytes())
        (OUT / f"{name}.quantized").write_bytes(blocks.tobytes())
        print(f"{name}: quantized {values.size} values into {blocks.nbytes} bytes")


if __name__ == "__main__":
    main()
