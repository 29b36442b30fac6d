#!/usr/bin/env python3
"""Compare mllm-rs with llama.cpp on the same GGUF, same threads, in one run.

Usage (from the repository root):
    python3 scripts/compare_llamacpp.py [--rounds 5] [--threads 2] [-p 128,512] [-n 128]
        [-d DEPTH] [-b BATCH] [--kv-dtype f16] [--gguf OTHER.gguf] [--int8-activations]
        [--max-simd avx2|avxvnni|avx512] [--json OUT.json]

What it does:
0. Builds the release binaries it runs (on a machine without cargo, it uses
   those already copied into target/release, or names the missing ones).
1. Fetches the default model (SmolLM2-135M-Instruct Q4_1 GGUF) and its .mllm
   conversion into the cache, by running the bench example once.
2. Creates a throwaway venv in the cache with llama-cpp-python pinned to
   LLAMA_CPP_PYTHON (it compiles llama.cpp from source on first use, with
   GGML_NATIVE=OFF, this CPU's AVX2/AVX-512/VNNI levels named one by one
   and AMX off: a native build can pick AMX, which faults in some VMs).
3. Measures the machine's rooflines once: read bandwidth (`examples/membw`,
   of the huge-page memory the repacked weights live in) and the
   multiply-add peaks (`examples/peak`), with the same threads.
4. Alternates the two engines round by round (each round: one process per
   engine, one warm-up and one timed repetition per test), so both see the
   same machine conditions, and prints a Markdown table of medians, the
   spread (min-max), the ratio mllm-rs / llama.cpp (the median of the
   per-round ratios, with their spread) and mllm-rs's share of the
   roofline, plus peak RSS and the CPU and kernel level that ran.
   Decode share: the file's tensor bytes per token times tokens/s over the
   read bandwidth. Prefill share: one multiply-add per parameter and token
   over the byte (u8 x i8) peak, or over the f32 FMA peak for float files
   (two or more bytes per parameter); attention's own work is left out.
With `--json OUT.json` it also writes every round's numbers there (each
engine's tokens/s per test and round, the per-round ratios, peak RSS, the
rooflines, the CPU and kernel level), so that runs on one machine can be
pooled: the median of all their per-round ratios.
With `-d DEPTH` every test starts after DEPTH tokens already in the KV
cache, in both engines (decode at depth reads the cache too, which the
decode share leaves out). llama.cpp keeps its cache in f16 (its default);
`--kv-dtype f16` gives mllm-rs the same cache type (its default is f32).
With `-b BATCH` the tg tests decode BATCH sequences together (a server's
step), in both engines (llama.cpp through its batch API, one KV-cache
sequence each); tokens/s counts every sequence's tokens, and the decode
share counts the weights once per step.
With `--max-simd avx2` both engines run as on an AVX2-only CPU: mllm-rs
with `--max-simd avx2`, llama.cpp from a second build (its own venv) with
every AVX-512 and VNNI option off. `--max-simd avxvnni` (a CPU with
AVX-VNNI) runs them as on an AVX2 CPU with AVX-VNNI and no AVX-512, such
as Intel's client chips since Alder Lake: llama.cpp built with AVX-VNNI
and without AVX-512. `--max-simd avx512`, on a CPU with AMX tiles, runs
mllm-rs at its AVX-512 level, as on an AVX-512 CPU without them (a Zen 4,
or a Xeon whose tiles are off), against llama.cpp's usual build, which
has AMX off anyway.
Run it on an otherwise idle machine.
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys

LLAMA_CPP_PYTHON = "0.3.36"
ROOT = pathlib.Path(__file__).resolve().parent.parent
# The release binaries the comparison runs.
RELEASE = ROOT / "target" / "release"


def cache_dir():
    env = os.environ.get("MLLM_RS_CACHE")
    if env:
        return pathlib.Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache"
    return base / "mllm-rs"


def cpu_flags():
    """The x86 feature flags of this CPU (empty elsewhere)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cmake_args(max_simd=None):
    """llama.cpp's build options: no native build (`-march=native` can pick
    AMX, which faults in some VMs), the SIMD levels this CPU has turned on
    one by one (none past AVX2 when `max_simd` is "avx2", none past AVX2
    and AVX-VNNI when it is "avxvnni"), AMX always off."""
    flags = cpu_flags()
    if max_simd in ("avx2", "avxvnni"):
        flags = {f for f in flags if not f.startswith("avx512")}
    if max_simd == "avx2":
        flags.discard("avx_vnni")
    has = lambda *names: all(n in flags for n in names)
    opts = {
        "GGML_NATIVE": False,
        "GGML_AVX": has("avx"),
        "GGML_AVX2": has("avx2"),
        "GGML_FMA": has("fma"),
        "GGML_F16C": has("f16c"),
        "GGML_AVX512": has("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"),
        "GGML_AVX512_VNNI": has("avx512f", "avx512_vnni"),
        "GGML_AVX_VNNI": has("avx_vnni"),
        "GGML_AMX_TILE": False,
        "GGML_AMX_INT8": False,
        "GGML_AMX_BF16": False,
    }
    return " ".join(f"-D{k}={'ON' if v else 'OFF'}" for k, v in opts.items())


def ensure_venv(max_simd=None):
    """The venv of the llama.cpp build for `max_simd`: its own build for
    "avx2" and "avxvnni"; the usual one otherwise ("avx512" too, since the
    usual build has no AMX code)."""
    if max_simd not in ("avx2", "avxvnni"):
        max_simd = None
    suffix = f"-{max_simd}" if max_simd else ""
    venv = cache_dir() / f"llama-cpp-python-{LLAMA_CPP_PYTHON}{suffix}"
    python = venv / "bin" / "python"
    if not python.exists():
        args = cmake_args(max_simd)
        print(f"building llama-cpp-python {LLAMA_CPP_PYTHON} into {venv} (several minutes)\n"
              f"  CMAKE_ARGS={args}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        env = dict(os.environ, CMAKE_ARGS=args, FORCE_CMAKE="1")
        subprocess.run([str(python), "-m", "pip", "install", "--no-cache-dir", "--no-binary",
                        "llama-cpp-python", f"llama-cpp-python=={LLAMA_CPP_PYTHON}"],
                       check=True, env=env)
    return python


def roofline(threads, max_simd=None):
    """(read GB/s, f32 GMAC/s, byte GMAC/s) of this machine on `threads`,
    the peaks at the fastest level or at `max_simd` (AVX2's f32 peak for
    "avxvnni")."""
    examples = RELEASE / "examples"
    out = subprocess.run([str(examples / "membw"), "-t", str(threads), "-r", "10"],
                         check=True, capture_output=True, text=True).stdout
    bandwidth = float(out.split("read bandwidth:")[1].split()[0])
    out = subprocess.run([str(examples / "peak"), "-t", str(threads), "-r", "5", "--all-levels"],
                         check=True, capture_output=True, text=True).stdout
    peaks = {}
    for line in out.splitlines():
        if "GMAC/s" in line:
            words = line.split()
            at = words.index("GMAC/s")
            kind = "byte" if line.startswith("byte") else "f32"
            # The AVX-VNNI level is integer-only: its float kernels are AVX2's.
            level = "avx2" if (kind, max_simd) == ("f32", "avxvnni") else max_simd
            if words[at - 2] == level or (level is None and kind not in peaks):
                peaks[kind] = float(words[at - 1])
    return bandwidth, peaks.get("f32"), peaks.get("byte")


def build_binaries():
    """Builds the release binaries the comparison runs. On a machine
    without cargo (binaries built elsewhere and copied into target/release),
    uses those that are there, or says which are missing."""
    needed = [RELEASE / "examples" / name for name in ("bench", "membw", "peak")]
    needed.append(RELEASE / "mllm-convert")
    if shutil.which("cargo") is None:
        missing = [str(p) for p in needed if not p.exists()]
        if missing:
            sys.exit("cargo is not on PATH and these prebuilt binaries are missing: "
                     + ", ".join(missing))
        print("cargo is not on PATH: using the binaries already in target/release",
              file=sys.stderr)
        return
    subprocess.run(["cargo", "build", "--release", "--example", "bench", "--example", "membw",
                    "--example", "peak", "-p", "mllm",
                    "--bin", "mllm-convert", "-p", "mllm-convert"], check=True, cwd=ROOT)


def run_json(cmd):
    """The JSON that `cmd` prints on stdout; its stderr (the default model's
    fetch and conversion on a first run, errors) goes to ours."""
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    try:
        return json.loads(out)
    except json.JSONDecodeError as e:
        sys.exit(f"{pathlib.Path(cmd[0]).name} printed no JSON ({e}); "
                 f"its output began: {out[:200]!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-p", "--n-prompt", default="128,512")
    ap.add_argument("-n", "--n-gen", default="128")
    ap.add_argument("-d", "--n-depth", type=int, default=0,
                    help="tokens already in the KV cache before each test (not timed)")
    ap.add_argument("-b", "--batch", type=int, default=1,
                    help="sequences decoded together in the tg tests")
    ap.add_argument("--kv-dtype", choices=["f32", "f16", "q8_0", "q4"],
                    help="mllm-rs's KV-cache type (its default: f32; llama.cpp's is f16)")
    ap.add_argument("--gguf", type=pathlib.Path,
                    help="another GGUF to compare on (converted to .mllm next to it); "
                         "default: the cached SmolLM2 Q4_1")
    ap.add_argument("--int8-activations", action="store_true",
                    help="run mllm-rs with --int8-activations (8-bit activations for "
                         "Q4/Q5/K-quant weights, as llama.cpp)")
    ap.add_argument("--max-simd", choices=["avx2", "avxvnni", "avx512"],
                    help="run both engines as on an AVX2-only CPU, one with "
                    "AVX2 and AVX-VNNI but no AVX-512, or one with AVX-512 but "
                    "no AMX tiles (see above)")
    ap.add_argument("--json", type=pathlib.Path, dest="json_out",
                    help="also write every round's numbers to this file (see above)")
    args = ap.parse_args()

    build_binaries()
    bench = RELEASE / "examples" / "bench"
    if args.batch < 1:
        ap.error("--batch must be at least 1")
    common = ["-p", args.n_prompt, "-n", args.n_gen, "-d", str(args.n_depth),
              "-b", str(args.batch), "-t", str(args.threads), "-r", "1"]
    flags = ["--int8-activations"] if args.int8_activations else []
    if args.max_simd:
        flags += ["--max-simd", args.max_simd]
    if args.kv_dtype:
        flags += ["--kv-dtype", args.kv_dtype]
    if args.gguf:
        gguf = args.gguf
        model = gguf.with_suffix(".mllm")
        if not model.exists():
            subprocess.run([str(RELEASE / "mllm-convert"), str(gguf),
                            "-o", str(model), "--quiet"], check=True)
        ours = [str(bench), "--json", "-m", str(model)] + common + flags
    else:
        # The first run fetches and converts the default model if needed.
        run_json([str(bench), "--json", "-p", "16", "-n", "0", "-t", str(args.threads), "-r", "1"])
        gguf = cache_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"
        ours = [str(bench), "--json"] + common + flags
    python = ensure_venv(args.max_simd)
    peer = [str(python), str(ROOT / "scripts" / "llamacpp_bench.py"), "-m", str(gguf)] + common

    bandwidth, f32_peak, byte_peak = roofline(args.threads, args.max_simd)
    samples = {"mllm-rs": {}, "llama.cpp": {}}
    ratios = {}
    rss = {"mllm-rs": [], "llama.cpp": []}
    about = {}
    for r in range(args.rounds):
        this_round = {}
        for engine, cmd in (("mllm-rs", ours), ("llama.cpp", peer)):
            for test in run_json(cmd):
                key = f"pp{test['n_prompt']}" if test["n_prompt"] else f"tg{test['n_gen']}"
                if not test["n_prompt"] and args.batch > 1:
                    key += f" x{args.batch}"
                if args.n_depth:
                    key += f" @ d{args.n_depth}"
                samples[engine].setdefault(key, []).extend(test["samples_ts"])
                this_round.setdefault(key, {})[engine] = statistics.median(test["samples_ts"])
                rss[engine].append(test["peak_rss_bytes"])
                if engine == "mllm-rs":
                    about = test
        for key, tps in this_round.items():
            ratios.setdefault(key, []).append(tps["mllm-rs"] / tps["llama.cpp"])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    size, params = about["model_size"], about["model_n_params"]
    is_float = size >= 2 * params
    peak, peak_name = (f32_peak, "f32 FMA") if is_float else (byte_peak, "byte multiply-add")
    print(f"CPU: {about['cpu_info']}; mllm-rs kernel level: {about['kernel_level']}; "
          f"KV cache: mllm-rs {args.kv_dtype or 'f32'}, llama.cpp f16; "
          f"{args.threads} threads; read bandwidth {bandwidth:.1f} GB/s; "
          f"peaks {f32_peak} GMAC/s (f32 FMA), {byte_peak} GMAC/s (byte)\n")
    print(f"| test | mllm-rs t/s (median, min-max) | llama.cpp {LLAMA_CPP_PYTHON} t/s (median, min-max) "
          f"| ratio (median of rounds, min-max) | mllm-rs share of roofline |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for key in samples["mllm-rs"]:
        ours, theirs, rs = samples["mllm-rs"][key], samples["llama.cpp"][key], ratios[key]
        mo, mt = statistics.median(ours), statistics.median(theirs)
        if key.startswith("tg"):
            steps = mo / (args.batch if " x" in key else 1)
            share = f"{100 * size * steps / (bandwidth * 1e9):.0f} % of {bandwidth:.1f} GB/s"
        elif peak:
            share = f"{100 * params * mo / (peak * 1e9):.1f} % of {peak:.0f} GMAC/s ({peak_name})"
        else:
            share = "no peak measured"
        print(f"| {key} | {mo:.1f} ({min(ours):.1f}-{max(ours):.1f}) | "
              f"{mt:.1f} ({min(theirs):.1f}-{max(theirs):.1f}) | "
              f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f}) | {share} |")
    mib = lambda b: b / (1024 * 1024)
    print(f"\npeak RSS: mllm-rs {mib(max(rss['mllm-rs'])):.1f} MiB, "
          f"llama.cpp {mib(max(rss['llama.cpp'])):.1f} MiB (excluding the Python interpreter)")
    if args.json_out:
        record = {
            "gguf": str(gguf), "threads": args.threads, "rounds": args.rounds,
            "int8_activations": args.int8_activations, "max_simd": args.max_simd,
            "kv_dtype": args.kv_dtype or "f32", "batch": args.batch, "cpu": about["cpu_info"],
            "kernel_level": about["kernel_level"], "llama_cpp_python": LLAMA_CPP_PYTHON,
            "read_bandwidth_gbs": bandwidth, "f32_peak_gmacs": f32_peak,
            "byte_peak_gmacs": byte_peak, "tokens_per_s": samples, "ratios": ratios,
            "peak_rss_bytes": {engine: max(v) for engine, v in rss.items()},
        }
        tmp = args.json_out.with_name(args.json_out.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        tmp.replace(args.json_out)
        print(f"wrote {args.json_out}", file=sys.stderr)


if __name__ == "__main__":
    main()
