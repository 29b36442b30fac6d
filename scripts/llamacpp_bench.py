#!/usr/bin/env python3
"""Time llama.cpp (through llama-cpp-python) the way `examples/bench.rs` times mllm-rs.

A pp test times one prefill of N random tokens from an empty KV cache; a tg
test times N single-token decode steps from an empty cache. With -d D, each
test starts after D random tokens already in the cache (their prefill is not
timed), as `bench -d` does. One warm-up run, then -r timed runs. Prints one
JSON array with llama-bench's field names.

peak_rss_bytes is the process's peak RSS minus the RSS of the Python
interpreter with llama_cpp imported, measured before the model is loaded, so
it counts what llama.cpp itself holds.
"""
import argparse
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
    args = ap.parse_args()

    import llama_cpp

    baseline = rss_now_bytes()
    prompts = [int(x) for x in args.n_prompt.split(",") if int(x) > 0]
    gens = [int(x) for x in args.n_gen.split(",") if int(x) > 0]
    n_ctx = args.n_depth + max(prompts + gens + [16]) + 16
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

    results = []
    for n_prompt, n_gen in [(p, 0) for p in prompts] + [(0, g) for g in gens]:
        run(n_prompt, n_gen)
        samples_ns = [run(n_prompt, n_gen) for _ in range(args.repetitions)]
        n = n_prompt + n_gen
        samples_ts = [n * 1e9 / ns for ns in samples_ns]
        results.append({
            "model_filename": args.model,
            "n_threads": args.threads,
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "n_depth": args.n_depth,
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
