#!/usr/bin/env bash
# Load benchmark of mllm-server on the default model: for each client count,
# starts a fresh server on 127.0.0.1, runs the loadtest example against it,
# and records the server's peak RSS (VmHWM). Prints one JSON line per run and
# a Markdown table at the end.
#
# Usage: scripts/server_loadtest.sh [CLIENTS...]      (default: 1 4 16 64)
# Env:   THREADS (2), PARALLEL (8), MAX_TOKENS (64), PORT (8099),
#        REQUESTS_PER_CLIENT (2; at least 16 requests per run),
#        SERVER_ARGS (more flags for the server, e.g. "--prefill-chunk 16")
set -euo pipefail
cd "$(dirname "$0")/.."

clients=("$@")
[ ${#clients[@]} -eq 0 ] && clients=(1 4 16 64)
threads=${THREADS:-2}
parallel=${PARALLEL:-8}
max_tokens=${MAX_TOKENS:-64}
port=${PORT:-8099}
per_client=${REQUESTS_PER_CLIENT:-2}

cargo build --release -q -p mllm-server --bin mllm-server --example loadtest
server=target/release/mllm-server
loadtest=target/release/examples/loadtest

results=$(mktemp)
for n in "${clients[@]}"; do
    requests=$((n * per_client))
    [ "$requests" -lt 16 ] && requests=16
    # shellcheck disable=SC2086
    "$server" --threads "$threads" --parallel "$parallel" --port "$port" ${SERVER_ARGS:-} \
        >/tmp/mllm-server-bench.log 2>&1 &
    pid=$!
    trap 'kill $pid 2>/dev/null || true; rm -f "$results"' EXIT
    for _ in $(seq 1 300); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        sleep 0.2
    done
    json=$("$loadtest" --url "http://127.0.0.1:$port" --clients "$n" --requests "$requests" \
        --max-tokens "$max_tokens" --json) || true
    rss_kib=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    line="{\"peak_rss_kib\": $rss_kib, \"report\": $json}"
    echo "$line"
    echo "$line" >>"$results"
done

python3 - "$results" <<'PY'
import json, sys

def f(v, p=1):
    return "n/a" if v is None else f"{v:.{p}f}"

runs = [json.loads(line) for line in open(sys.argv[1])]
print()
print("| clients | ok / requests | failed | mixed up | output tokens/s | vs single-client decode | TTFT p50 / p99 ms | ITL p50 / p99 ms | peak RSS MiB |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for run in runs:
    r = run["report"]
    rss = run["peak_rss_kib"] / 1024
    print(f"| {r['clients']} | {r['requests_ok']} / {r['requests_issued']} | {r['requests_failed']} "
          f"| {r['requests_mismatched']} | {f(r['aggregate_tokens_per_s'])} "
          f"| {f(r['aggregate_over_single'], 2)}x | {f(r['ttft_ms_p50'], 0)} / {f(r['ttft_ms_p99'], 0)} "
          f"| {f(r['itl_ms_p50'])} / {f(r['itl_ms_p99'])} | {rss:.1f} |")
singles = [run["report"]["single_client_decode_tokens_per_s"] for run in runs]
print()
print("single-client decode per run (reference passes): " + ", ".join(f(s) for s in singles) + " tokens/s")
PY
