"""Shared fixtures: the repository's tiny models converted once per session,
their transformers references, and the default SmolLM2 model."""

import json
import pathlib
import struct

import numpy as np
import pytest

import mllm_rs

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures"


def read_safetensors(path):
    """The arrays of a float32 safetensors file, by name."""
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    body = data[8 + header_len :]
    arrays = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        start, end = info["data_offsets"]
        arrays[name] = np.frombuffer(body[start:end], dtype="<f4").reshape(info["shape"])
    return arrays


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "tiny-llama.mllm"
    mllm_rs.convert(FIXTURES / "tiny-llama", out)
    return out


@pytest.fixture(scope="session")
def tiny_llama(tiny_llama_path):
    return mllm_rs.Model(tiny_llama_path, threads=2)


@pytest.fixture(scope="session")
def tiny_llama_reference():
    ref = FIXTURES / "tiny-llama" / "reference"
    return json.loads((ref / "reference.json").read_text()), read_safetensors(ref / "reference.safetensors")


@pytest.fixture(scope="session")
def smollm2():
    return mllm_rs.Model(threads=2)
