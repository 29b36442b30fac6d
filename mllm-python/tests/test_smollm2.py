"""mllm_rs on the default model (SmolLM2-135M-Instruct Q4_1): chat,
streaming, batches, tokenizing, threads and Ctrl-C."""

import _thread
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

import mllm_rs

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_answers_paris(smollm2):
    reply = smollm2.chat(QUESTION, max_tokens=32)
    assert "Paris" in reply, reply


def test_streaming_gives_the_text_of_generate(smollm2):
    prompt = "The three primary colours are"
    whole = smollm2.generate(prompt, max_tokens=24, ignore_eos=True)
    pieces = list(smollm2.stream(prompt, max_tokens=24, ignore_eos=True))
    assert len(pieces) > 3
    assert "".join(pieces) == whole
    # A stop string ends both at the same place, never inside a piece.
    stop = whole.split()[3]
    cut = smollm2.generate(prompt, max_tokens=24, ignore_eos=True, stop=[stop, "\u2603"])
    assert cut == whole[: whole.index(stop)]
    assert "".join(smollm2.stream(prompt, max_tokens=24, ignore_eos=True, stop=stop)) == cut


def test_sampling_with_a_seed_repeats(smollm2):
    a = smollm2.generate("Once upon a time", max_tokens=16, temperature=0.9, top_p=0.95, seed=7)
    b = smollm2.generate("Once upon a time", max_tokens=16, temperature=0.9, top_p=0.95, seed=7)
    assert a == b


def test_batch_gives_what_each_prompt_gives_alone(smollm2):
    prompts = ["The sun is", "Water boils at", [1, 504, 3458, 314]]
    batch = smollm2.generate_batch(prompts, max_tokens=12, ignore_eos=True)
    alone = [smollm2.generate(p, max_tokens=12, ignore_eos=True) for p in prompts]
    assert batch == alone


def test_tokenize_and_detokenize(smollm2):
    ids = smollm2.tokenize("Hello, world!")
    assert ids and all(isinstance(i, int) for i in ids)
    assert smollm2.detokenize(ids) == "Hello, world!"
    assert smollm2.eos_token_ids and smollm2.config["vocab_size"] == 49152
    logits = smollm2.logits(ids)
    assert logits.shape == (len(ids), 49152)


def test_a_gguf_loads_and_generates_as_its_conversion(smollm2):
    gguf = pathlib.Path(smollm2.path).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    info = mllm_rs.inspect(gguf)
    assert info["format"].startswith("gguf v")
    assert info["metadata"]["general.architecture"] == "llama"
    assert any(t["dtype"] == "q4_1" for t in info["tensors"])
    direct = mllm_rs.Model(gguf, threads=2)
    prompt = "The capital of Italy is"
    assert direct.generate(prompt, max_tokens=8) == smollm2.generate(prompt, max_tokens=8)


def test_two_threads_generate_at_once(smollm2):
    prompts = ["Tell me about cats.", "Tell me about the sea."]
    want = [smollm2.chat([{"role": "user", "content": p}], max_tokens=20) for p in prompts]
    got = [None, None]

    def work(i):
        got[i] = smollm2.chat([{"role": "user", "content": prompts[i]}], max_tokens=20)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


READ_WHILE_GENERATING = """
import sys, threading, mllm_rs
model = mllm_rs.Model(sys.argv[1], threads=2)
worker = threading.Thread(
    target=lambda: model.generate("Once upon a time", max_tokens=48, ignore_eos=True))
worker.start()
reads = 0
while worker.is_alive():
    model.max_context, model.eos_token_ids, repr(model)
    reads += 1
worker.join()
print(reads)
"""


def test_reading_the_model_while_another_thread_generates_does_not_deadlock(smollm2):
    # A deadlock would hang the process, so it runs in its own, with a timeout.
    done = subprocess.run([sys.executable, "-c", READ_WHILE_GENERATING, str(smollm2.path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0


def test_python_threads_run_while_the_model_computes(smollm2):
    ticks = 0
    done = threading.Event()

    def count():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    started = time.monotonic()
    smollm2.generate("Count to twenty:", max_tokens=48, ignore_eos=True)
    elapsed = time.monotonic() - started
    done.set()
    t.join()
    # With the GIL held for the whole call the counter would barely move.
    assert ticks >= 0.2 * elapsed / 0.001 * 0.5, (ticks, elapsed)


@pytest.mark.parametrize("how", ["generate", "stream"])
def test_ctrl_c_interrupts_a_long_generation(smollm2, how):
    # Python's own Ctrl-C handler, whatever the suite was started with: a
    # shell that starts it in the background passes SIGINT on as ignored,
    # and `interrupt_main` then does nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            if how == "generate":
                smollm2.generate("Write a very long story.", max_tokens=4000, ignore_eos=True)
            else:
                for _ in smollm2.stream("Write a very long story.", max_tokens=4000, ignore_eos=True):
                    pass
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 10
    # The model is usable right after.
    assert "Paris" in smollm2.chat(QUESTION, max_tokens=32)
