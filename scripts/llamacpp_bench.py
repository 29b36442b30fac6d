#!/usr/bin/env python3
"""Time llama.cpp (through llama-cpp-python) the way `examples/bench.rs` times mllm-rs.

A pp test times one prefill of N random tokens from an empty KV cache; a tg
test times N single-token decode steps from an empty cache. With -d D, each
test starts after D random tokens already in the cache (their prefill is not
timed), as `bench -d` does. With -b B (B > 1), a tg test decodes B sequences
together, each in its own sequence of the KV cache, one token each per step,
and its tokens/s counts every sequence's tokens, as `bench -b` does (pp tests
and the depth fill run as before, per sequence). One warm-up run, then -r
timed runs. Prints one JSON array with llama-bench's field names.

peak_rss_bytes is the process's peak RSS minus the RSS of the Python
interpreter with llama_cpp imported, measured before the model is loaded, so
it counts what llama.cpp itself holds.
"""
import argparse
import ctypes
import json
import random
import resource
import statistics
import time


def rss_now_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", "--n-prompt", default="512")
    ap.add_argument("-n", "--n-gen", default="128")
    ap.add_argument("-d", "--n-depth", type=int, default=0)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("-b", "--batch", type=int, default=1,
                    help="sequences decoded together in the tg tests")
    args = ap.parse_args()
    if args.batch < 1:
        ap.error("--batch must be at least 1")

    import llama_cpp

    baseline = rss_now_bytes()
    prompts = [int(x) for x in args.n_prompt.split(",") if int(x) > 0]
    gens = [int(x) for x in args.n_gen.split(",") if int(x) > 0]
    n_ctx = args.n_depth + max(prompts + gens + [16]) + 16
    if args.batch > 1:
        run = batched_runner(llama_cpp, args, prompts, n_ctx)
        report(args, prompts, gens, run, baseline)
        return
    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=n_ctx,
        n_batch=max(prompts + [1]),
        n_ubatch=max(prompts + [1]),
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    vocab = llm.n_vocab()
    rng = random.Random(0)

    def run(n_prompt, n_gen):
        llm.reset()
        if args.n_depth:
            llm.eval([rng.randrange(vocab) for _ in range(args.n_depth)])
        tokens = [rng.randrange(vocab) for _ in range(n_prompt or n_gen)]
        start = time.perf_counter_ns()
        if n_prompt:
            llm.eval(tokens)
        else:
            for tok in tokens:
                llm.eval([tok])
        return time.perf_counter_ns() - start

    report(args, prompts, gens, run, baseline)


def batched_runner(llama_cpp, args, prompts, n_ctx_per_seq):
    """`run(n_prompt, n_gen)` through llama.cpp's own batch API: a context
    with one KV-cache sequence per batched sequence, each n_ctx_per_seq
    positions long."""
    lib = llama_cpp
    # Quiet, as Llama(verbose=False) is; the callback must outlive the run.
    quiet = lib.llama_log_callback(lambda level, text, user_data: None)
    lib.llama_log_set(quiet, ctypes.c_void_p(0))
    lib.llama_backend_init()
    model = lib.llama_model_load_from_file(args.model.encode(), lib.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {args.model}")
    n_batch = max(prompts + [args.batch, 512])
    params = lib.llama_context_default_params()
    params.n_ctx = args.batch * n_ctx_per_seq
    params.n_batch = n_batch
    params.n_ubatch = n_batch
    params.n_seq_max = args.batch
    params.n_threads = args.threads
    params.n_threads_batch = args.threads
    ctx = lib.llama_init_from_model(model, params)
    if not ctx:
        raise SystemExit("llama.cpp could not make a context")
    vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
    batch = lib.llama_batch_init(n_batch, 0, 1)
    rng = random.Random(0)

    def decode(entries):
        """One llama_decode of (sequence, position, token) entries, logits
        for each."""
        batch.n_tokens = len(entries)
        for i, (seq, pos, tok) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = True
        if lib.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")

    def prefill(seq, first, tokens):
        """`tokens` into sequence `seq` from position `first`, n_batch at a
        time."""
        for at in range(0, len(tokens), n_batch):
            chunk = tokens[at:at + n_batch]
            decode([(seq, first + at + i, t) for i, t in enumerate(chunk)])

    def run(n_prompt, n_gen):
        lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
        for seq in range(args.batch):
            prefill(seq, 0, [rng.randrange(vocab) for _ in range(args.n_depth)])
        start = time.perf_counter_ns()
        if n_prompt:
            prefill(0, args.n_depth, [rng.randrange(vocab) for _ in range(n_prompt)])
        else:
            for step in range(n_gen):
                pos = args.n_depth + step
                decode([(seq, pos, rng.randrange(vocab)) for seq in range(args.batch)])
        return time.perf_counter_ns() - start

    run.keep_alive = (quiet, model, ctx, batch)
    return run


def report(args, prompts, gens, run, baseline):
    """Warms up, times -r runs of every test and prints the JSON array."""
    results = []
    for n_prompt, n_gen in [(p, 0) for p in prompts] + [(0, g) for g in gens]:
        run(n_prompt, n_gen)
        samples_ns = [run(n_prompt, n_gen) for _ in range(args.repetitions)]
        n = n_prompt + n_gen * args.batch
        samples_ts = [n * 1e9 / ns for ns in samples_ns]
        results.append({
            "model_filename": args.model,
            "n_threads": args.threads,
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "n_depth": args.n_depth,
            "n_batch": args.batch,
            "avg_ns": int(statistics.mean(samples_ns)),
            "stddev_ns": int(statistics.stdev(samples_ns)) if len(samples_ns) > 1 else 0,
            "avg_ts": statistics.mean(samples_ts),
            "stddev_ts": statistics.stdev(samples_ts) if len(samples_ts) > 1 else 0.0,
            "samples_ns": samples_ns,
            "samples_ts": samples_ts,
        })
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for r in results:
        r["peak_rss_bytes"] = max(peak - baseline, 0)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
