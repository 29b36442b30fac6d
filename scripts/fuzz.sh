#!/usr/bin/env bash
# Runs one libFuzzer target of fuzz/ (cargo-fuzz, nightly toolchain) from
# seeds made of the repository's fixtures.
#
# Usage: scripts/fuzz.sh TARGET [RUNS] [extra libFuzzer flags...]
#   TARGET: mllm_file | safetensors | sharded | gguf | gguf_tokenizer |
#           chat_template | server_request
#   RUNS:   executions (default 1000000)
# Needs `rustup toolchain install nightly` and `cargo install cargo-fuzz`.
# The corpus grows in fuzz/corpus/TARGET; crashes land in fuzz/artifacts/TARGET
# (turn each into a fix and a regression test). Inputs that run over 1 s
# count as hangs, and the process may not use more than 4 GiB. Leak checks
# are off: the model's thread pool lets its workers exit after it is
# dropped, and a worker still exiting at the check shows up as a 64-byte
# leak of its thread-local destructor list (glibc), not a leak of ours.
set -euo pipefail

target=${1:?usage: scripts/fuzz.sh TARGET [RUNS] [libFuzzer flags...]}
runs=${2:-1000000}
shift $(($# < 2 ? $# : 2))
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
corpus="$root/fuzz/corpus/$target"
mkdir -p "$corpus"

if [ -z "$(ls -A "$corpus")" ]; then
    fixtures="$root/tests/fixtures"
    case "$target" in
    mllm_file)
        for dtype in f32 q8_0 q4_0; do
            cargo run -q --release -p mllm-convert -- "$fixtures/tiny-llama" \
                -o "$corpus/tiny-llama-$dtype.mllm" --dtype "$dtype" --quiet
        done
        ;;
    safetensors)
        cp "$fixtures/tiny-llama/model.safetensors" "$corpus/tiny-llama.safetensors"
        ;;
    sharded)
        # One seed per file the first byte can pick: 0 index, 1 and 2 shards.
        pick=0
        for name in model.safetensors.index.json model-0000{1,2}-of-00002.safetensors; do
            { printf "\\x0$pick"; cat "$fixtures/tiny-llama/sharded/$name"; } >"$corpus/$name"
            pick=$((pick + 1))
        done
        ;;
    gguf)
        cp "$fixtures"/gguf/tiny-llama.f32.gguf "$fixtures"/gguf/*.q8_0.gguf "$corpus/"
        ;;
    gguf_tokenizer)
        cp "$fixtures"/gguf/*.vocab.gguf "$corpus/"
        ;;
    chat_template)
        cp "$fixtures"/chat_templates/*.seed "$corpus/"
        ;;
    server_request)
        cp "$fixtures"/requests/*.json "$corpus/"
        ;;
    *)
        echo "unknown target: $target" >&2
        exit 2
        ;;
    esac
fi

cd "$root/fuzz"
exec cargo +nightly fuzz run "$target" "$corpus" -- \
    -runs="$runs" -timeout=1 -rss_limit_mb=4096 -detect_leaks=0 -print_final_stats=1 "$@"
