#!/usr/bin/env bash
# Cross-tests mllm-ops on aarch64 under qemu user-mode emulation from an
# x86-64 host, so that the NEON kernels run against the scalar reference.
#
# Usage (from anywhere in the repository):
#     scripts/test-aarch64.sh [--install] [ARGS...]
# ARGS go to `cargo test` (e.g. `scripts/test-aarch64.sh neon -- --nocapture`).
# Without --install it installs nothing: when a tool is missing it prints
# the command that installs it and exits with status 1. With --install
# (what CI passes) it adds the Rust target with rustup and the Debian
# packages with apt-get itself.
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu
install=0
if [ "${1:-}" = "--install" ]; then
    install=1
    shift
fi

target_missing=0
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    if [ "$install" -eq 1 ]; then
        rustup target add "$target"
    else
        echo "missing: the Rust target $target; install it with:" >&2
        echo "    rustup target add $target" >&2
        target_missing=1
    fi
fi
# shellcheck source=scripts/debian-tools.sh
. scripts/debian-tools.sh
cross_tools() {
    need aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu
    need "$sysroot/lib" libc6-dev-arm64-cross
    need qemu-aarch64 qemu-user
}
ensure_tools "$install" cross_tools
if [ "$target_missing" -ne 0 ]; then
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
