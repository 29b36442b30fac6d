#!/usr/bin/env bash
# Runs the tests of the unsafe code and of the file parsers under
# AddressSanitizer, and the parsers' tests under Miri (nightly toolchain).
#
# Usage: scripts/sanitize.sh [asan|miri|all]   (default all)
# Needs: rustup toolchain install nightly
#        rustup +nightly component add miri rust-src
#
# AddressSanitizer: the SIMD kernels' tests (every level the CPU has,
# checked against scalar), the .mllm / GGUF / safetensors readers' tests,
# and the mutation campaigns over hostile files, requests and templates.
# Miri: the parsers' unit tests and the GGUF reader's tests (hand-made
# files, every truncation and bad count, imports). Miri cannot map files,
# so `MappedFile` reads them into memory there; it runs the scalar kernels.
# Tests that start processes or encode text (Oniguruma is C) are ignored
# under Miri (`cfg_attr(miri, ignore)`).
set -euo pipefail

mode=${1:-all}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
host=$(rustc +nightly -vV | sed -n 's/^host: //p')

run_asan() {
    # --target keeps the sanitizer out of build scripts and proc macros;
    # a separate target dir keeps the instrumented build apart.
    local flags=(--target "$host" --target-dir target/asan)
    export RUSTFLAGS="-Zsanitizer=address" RUSTDOCFLAGS="-Zsanitizer=address"
    echo "== AddressSanitizer: kernels (mllm-ops)"
    cargo +nightly test "${flags[@]}" -p mllm-ops --lib
    echo "== AddressSanitizer: readers and parsers (mllm-core, mllm-convert)"
    cargo +nightly test "${flags[@]}" -p mllm-core -p mllm-convert
    echo "== AddressSanitizer: hostile files, inputs and requests"
    cargo +nightly test "${flags[@]}" -p mllm \
        --test bad_files --test hostile_files --test hostile_inputs --test gguf_import
    unset RUSTFLAGS RUSTDOCFLAGS
}

run_miri() {
    # Isolation off: the tests write and read temporary files. Tree
    # Borrows: rayon's work queues (crossbeam-epoch) break the older Stacked
    # Borrows rules in their intrusive list, as crossbeam documents, and are
    # checked with Tree Borrows in its own CI. The mllm-core tests start no
    # thread pool and run under Stacked Borrows.
    echo "== Miri: mllm-core unit tests (.mllm writer, file map, dtypes, npy)"
    MIRIFLAGS="-Zmiri-disable-isolation" cargo +nightly miri test -p mllm-core --lib
    export MIRIFLAGS="-Zmiri-disable-isolation -Zmiri-tree-borrows"
    echo "== Miri: GGUF reader and import (mllm-convert/tests/gguf.rs)"
    cargo +nightly miri test -p mllm-convert --test gguf
    unset MIRIFLAGS
}

case "$mode" in
asan) run_asan ;;
miri) run_miri ;;
all)
    run_asan
    run_miri
    ;;
*)
    echo "usage: scripts/sanitize.sh [asan|miri|all]" >&2
    exit 2
    ;;
esac
echo "sanitize: $mode passed"
