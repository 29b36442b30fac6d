"""mllm_rs on the tiny fixture models: logits and greedy ids against
transformers, conversion, inspection, and the errors bad input raises."""

import numpy as np
import pytest

import mllm_rs
from conftest import FIXTURES


def test_logits_equal_the_transformers_reference(tiny_llama, tiny_llama_reference):
    meta, arrays = tiny_llama_reference
    short = meta["inputs"]["short"]
    logits = tiny_llama.logits(short)
    assert isinstance(logits, np.ndarray)
    assert logits.dtype == np.float32 and logits.flags["C_CONTIGUOUS"]
    assert logits.shape == (len(short), 256)
    assert np.abs(logits - arrays["logits_short"]).max() <= 1e-4
    long = meta["inputs"]["long"]
    assert np.abs(tiny_llama.logits(long) - arrays["logits_long"]).max() <= 1e-4


def test_greedy_ids_equal_the_reference(tiny_llama, tiny_llama_reference):
    meta, _ = tiny_llama_reference
    for name in ["short", "long"]:
        greedy = meta["greedy"][name]
        got = tiny_llama.generate_ids(greedy["prompt_ids"], max_tokens=20, ignore_eos=True)
        assert got == greedy["new_ids"], name


def test_batched_greedy_ids_equal_each_alone(tiny_llama, tiny_llama_reference):
    meta, _ = tiny_llama_reference
    prompts = meta["batch"]["prompts"]
    alone = [tiny_llama.generate_ids(p, max_tokens=10, ignore_eos=True) for p in prompts]
    assert alone == meta["batch"]["new_ids"]


def test_config_and_properties(tiny_llama, tiny_llama_path):
    config = tiny_llama.config
    assert config["vocab_size"] == 256 and config["num_hidden_layers"] >= 1
    assert tiny_llama.eos_token_ids == [2]
    assert tiny_llama.max_context == 512
    assert "LlamaForCausalLM" in repr(tiny_llama)
    assert str(tiny_llama.path) == str(tiny_llama_path)


def test_convert_and_inspect_describe_the_file(tmp_path):
    out = tmp_path / "q8.mllm"
    report = mllm_rs.convert(FIXTURES / "tiny-llama", out, dtype="q8_0")
    assert report["architecture"] == "LlamaForCausalLM"
    assert report["output"] == str(out) and report["bytes_written"] == out.stat().st_size
    info = mllm_rs.inspect(out)
    assert info["format"] == "mllm" and info["size"] == out.stat().st_size
    assert info["config"]["vocab_size"] == 256
    names = {t["name"]: t for t in info["tensors"]}
    assert names["model.embed_tokens.weight"]["shape"] == [256, 64]
    assert {t["dtype"] for t in info["tensors"]} >= {"q8_0", "f32"}


def test_bad_files_raise_bad_file_error(tmp_path, tiny_llama_path):
    with pytest.raises(mllm_rs.BadFileError, match="I/O error"):
        mllm_rs.Model(tmp_path / "missing.mllm")
    cut = tmp_path / "cut.mllm"
    cut.write_bytes(tiny_llama_path.read_bytes()[:1000])
    with pytest.raises(mllm_rs.BadFileError):
        mllm_rs.Model(cut)
    with pytest.raises(mllm_rs.MllmError):
        mllm_rs.inspect(cut)
    with pytest.raises(mllm_rs.InvalidInputError, match="unknown dtype 'q9'"):
        mllm_rs.convert(FIXTURES / "tiny-llama", tmp_path / "x.mllm", dtype="q9")


def test_bad_input_raises_invalid_input_error(tiny_llama):
    errors = [
        (lambda: tiny_llama.generate_ids([]), "empty"),
        (lambda: tiny_llama.generate_ids([1, 999]), "999"),
        (lambda: tiny_llama.generate_ids([1, 2], temperature=-1.0), "temperature"),
        (lambda: tiny_llama.generate_ids([1, 2], top_p=2.0), "top_p"),
        (lambda: tiny_llama.generate_ids([1, 2], max_tokens="many"), "max_tokens must be an int"),
        (lambda: tiny_llama.generate_ids([1, 2], colour="red"), "unknown keyword argument \"colour\""),
        (lambda: tiny_llama.generate_ids([1, 2], stop="x"), "stop strings"),
        (lambda: tiny_llama.generate_ids(3.5), "prompt must be a str or a list of token ids"),
        (lambda: tiny_llama.generate("hello"), "embeds no tokenizer"),
        (lambda: tiny_llama.logits([]), "empty"),
        (lambda: tiny_llama.chat([]), "messages is empty"),
        (lambda: tiny_llama.chat([{"role": "user"}]), "messages[0] needs a str \"content\""),
    ]
    for call, message in errors:
        with pytest.raises(mllm_rs.InvalidInputError) as info:
            call()
        assert message in str(info.value), str(info.value)
        assert isinstance(info.value, mllm_rs.MllmError)
    # The model still works afterwards.
    assert len(tiny_llama.generate_ids([1, 2, 3], max_tokens=3, ignore_eos=True)) == 3


def test_a_prompt_over_the_context_raises_context_full_error(tiny_llama):
    with pytest.raises(mllm_rs.ContextFullError, match="context full"):
        tiny_llama.logits([5] * 513)
    with pytest.raises(mllm_rs.ContextFullError):
        tiny_llama.generate_ids([5] * 600, max_tokens=1)
