#!/usr/bin/env bash
# Cross-tests mllm-ops on aarch64 under qemu user-mode emulation from an
# x86-64 host, so that the NEON kernels run against the scalar reference.
# Installs nothing: when a tool is missing it prints the command that
# installs it and exits with status 1. Extra arguments go to the test
# binaries (e.g. `scripts/test-aarch64.sh neon -- --nocapture`).
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu
missing=0

if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    echo "missing: the Rust target $target; install it with:" >&2
    echo "    rustup target add $target" >&2
    missing=1
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null || [ ! -d "$sysroot/lib" ]; then
    echo "missing: the aarch64 cross linker and C library; install them with:" >&2
    echo "    sudo apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross" >&2
    missing=1
fi
if ! command -v qemu-aarch64 >/dev/null; then
    echo "missing: qemu-aarch64; install it with:" >&2
    echo "    sudo apt-get install qemu-user" >&2
    missing=1
fi
if [ "$missing" -ne 0 ]; then
    exit 1
fi

# The same linker and runner as .cargo/config.toml, set here too so that the
# script works without it.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $sysroot"
# qemu-user drops madvise(MADV_HUGEPAGE) (a hint), so the tests that read
# that advice back from /proc/self/smaps skip.
export MLLM_TEST_EMULATED=1
cargo test -p mllm-ops --target "$target" --tests "$@"
