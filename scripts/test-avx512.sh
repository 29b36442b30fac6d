#!/usr/bin/env bash
# Runs the kernel tests at the AVX-512 level on a CPU without AVX-512: the
# tests are built as static binaries and run inside a Linux guest of the
# Bochs emulator, whose Tiger Lake model has AVX-512F/BW/VL and AVX-512
# VNNI (but not the VEX-encoded AVX-VNNI, so the `avxvnni` level skips
# there as on real Tiger Lakes). qemu's user and system emulators have no
# AVX-512 at all.
#
# Usage (from anywhere in the repository):
#     scripts/test-avx512.sh [--install] [FILTER...]
# FILTER... goes to every test binary of the mllm-ops library and
# integration tests and the whole-model `quantized_models` tests; the
# default picks the tests that compare SIMD levels with each other and with
# the portable kernels (names with simd, level, vnni or avx512, and the
# stacked linear layers at every level). They run on one thread with
# `--nocapture`, so that every level a test skips is named. The emulator
# runs these tests about a thousand times slower than the CPU: the default
# set takes minutes, every test (FILTER '') hours.
#
# Without --install it installs nothing: when a tool is missing it prints
# the command that installs it and exits with status 1. With --install
# (what CI passes) it installs the missing packages itself with apt-get,
# as root or through sudo, after refreshing the package lists. The guest
# kernel is Debian's cloud kernel, fetched once with `apt-get download`
# (no root needed) into $MLLM_CACHE_DIR/avx512-guest (default
# ~/.cache/mllm-rs/avx512-guest).
# MLLM_EMU_TIMEOUT (seconds, default 5400) bounds the emulator's run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

target=x86_64-unknown-linux-gnu
cache=${MLLM_CACHE_DIR:-$HOME/.cache/mllm-rs}/avx512-guest
timeout_s=${MLLM_EMU_TIMEOUT:-5400}
install=0
if [ "${1:-}" = "--install" ]; then
    install=1
    shift
fi

# shellcheck source=scripts/debian-tools.sh
. scripts/debian-tools.sh
guest_tools() {
    need bochs bochs bochs-term bochsbios vgabios
    need /usr/lib/x86_64-linux-gnu/bochs/plugins/libbx_term_gui.so bochs-term
    need /usr/share/bochs/BIOS-bochs-latest bochsbios
    need /usr/share/bochs/VGABIOS-lgpl-latest vgabios
    need genisoimage genisoimage
    need /usr/lib/ISOLINUX/isolinux.bin isolinux
    need /usr/lib/syslinux/modules/bios/ldlinux.c32 syslinux-common
    need script bsdutils
    need strip binutils
    if ! busybox cpio --help >/dev/null 2>&1 || ldd "$(command -v busybox)" >/dev/null 2>&1; then
        lack "a static busybox with cpio" busybox-static
    fi
}
ensure_tools "$install" guest_tools

# The guest kernel: Debian bookworm's 6.12 cloud kernel (serial console,
# devtmpfs and tmpfs built in). Debian's 6.1 kernel loops in this emulator
# on a page fault at a per-CPU address right after the mount caches.
mkdir -p "$cache"
kernel=$cache/vmlinuz
guest_kernel_package() {
    apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64$' |
        awk '{print $1}' | sort -V | tail -n 1
}
if [ ! -s "$kernel" ]; then
    package=$(guest_kernel_package)
    if [ -z "$package" ] && [ "$install" -eq 1 ]; then
        # Bookworm's security suite has it; stale lists may not yet.
        as_root apt-get update -q >&2
        package=$(guest_kernel_package)
    fi
    if [ -z "$package" ]; then
        echo "no linux-image-6.12.*+deb12-cloud-amd64 in the apt lists: Debian bookworm has it" >&2
        echo "in bookworm-security and bookworm-backports; add one and run apt-get update" >&2
        exit 1
    fi
    echo "fetching the guest kernel ($package)" >&2
    (cd "$cache" && rm -rf unpacked ./*.deb && apt-get download "$package" >&2 &&
        dpkg-deb -x ./*.deb unpacked && cp unpacked/boot/vmlinuz-* vmlinuz.part &&
        mv vmlinuz.part vmlinuz && rm -rf unpacked ./*.deb)
fi

# Static test binaries: the guest has no C library. RUSTFLAGS with
# --target reaches only the target's crates, so build scripts and proc
# macros stay as they are and the host build is not invalidated.
build() {
    RUSTFLAGS="-C target-feature=+crt-static" cargo test --release --no-run \
        --target "$target" --message-format=json "$@" |
        grep -o '"executable":"[^"]*"' | sed 's/^"executable":"//; s/"$//'
}
work=$(mktemp -d)
trap 'pkill -KILL -f -- "-f $work/bochsrc" 2>/dev/null || true; rm -rf "$work"' EXIT
build -p mllm-ops --lib --tests > "$work/binaries"
build -p mllm --test quantized_models >> "$work/binaries"
mapfile -t binaries < "$work/binaries"
guest=$work/root
mkdir -p "$guest"/{bin,dev,proc,sys,tmp}
cp "$(command -v busybox)" "$guest/bin/busybox"
names=()
for b in "${binaries[@]}"; do
    name=$(basename "$b")
    strip -o "$guest/bin/$name" "$b"
    names+=("$name")
done
# The tests find their fixtures under the absolute paths they were built
# with; the guest gets the ones these tests read.
for dir in tests/fixtures/tiny-gpt2 tests/fixtures/tiny-llama mllm-ops/tests/data; do
    mkdir -p "$guest$root/$dir"
    cp -r "$dir/." "$guest$root/$dir"
done
if [ "$#" -eq 0 ]; then
    set -- simd level vnni avx512 stacks_of_one_type
fi
# Quoted here, so that the guest's shell reads them as given.
filters=$(printf '%q ' "$@")
cat > "$guest/init" <<EOF
#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t devtmpfs dev /dev
/bin/busybox mount -t tmpfs tmp /tmp
echo "=== guest CPU flags:"
/bin/busybox grep -m1 '^flags' /proc/cpuinfo | /bin/busybox tr ' ' '\n' |
    /bin/busybox grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx_vnni)\$' |
    /bin/busybox tr '\n' ' '
echo
cd /tmp
for t in ${names[*]}; do
    echo "=== \$t"
    TMPDIR=/tmp /bin/\$t --test-threads=1 --nocapture $filters 2>&1
    echo "=== \$t rc=\$?"
done
echo "=== guest done"
# Wait until the serial line has sent everything (stty sets the line with
# TCSADRAIN) before the power goes.
/bin/busybox stty -F /dev/console sane
/bin/busybox poweroff -f
EOF
chmod +x "$guest/init"
(cd "$guest" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 > "$work/initrd.img")

# The kernel's command line works around what Bochs 2.7 gets wrong: it
# gives the standard XSAVE size for the compacted formats, so with XSAVES
# or XSAVEC the kernel turns XSAVE, and with it AVX, off; and it lacks
# the APERF/MPERF registers. The other options (PCID, 5-level paging and
# protection keys off, polling idle, no TSC deadline timer, periodic
# ticks) come from the attempts with Debian's 6.1 kernel and stay as the
# set this guest was verified with.
iso=$work/iso
mkdir -p "$iso/isolinux"
cp /usr/lib/ISOLINUX/isolinux.bin /usr/lib/syslinux/modules/bios/ldlinux.c32 "$iso/isolinux/"
cp "$kernel" "$iso/vmlinuz"
cp "$work/initrd.img" "$iso/initrd.img"
cat > "$iso/isolinux/isolinux.cfg" <<EOF
default linux
prompt 0
timeout 0
label linux
  kernel /vmlinuz
  append initrd=/initrd.img console=ttyS0 mitigations=off no5lvl nopcid clearcpuid=xsaves,xsavec,xsaveopt,pku,aperfmperf idle=poll lapic=notscdeadline nohz=off no_timer_check
EOF
genisoimage -quiet -o "$work/boot.iso" -b isolinux/isolinux.bin -c isolinux/boot.cat \
    -no-emul-boot -boot-load-size 4 -boot-info-table -J -R "$iso"

serial=$work/serial.log
cat > "$work/bochsrc" <<EOF
cpu: model=tigerlake, count=1, ips=200000000
memory: guest=2048, host=2048
romimage: file=/usr/share/bochs/BIOS-bochs-latest
vgaromimage: file=/usr/share/bochs/VGABIOS-lgpl-latest
ata0-master: type=cdrom, path=$work/boot.iso, status=inserted
boot: cdrom
com1: enabled=1, mode=file, dev=$serial
display_library: term
clock: sync=none, time0=local
log: $work/bochs.log
panic: action=fatal
error: action=ignore
info: action=ignore
debug: action=ignore
EOF
# Debian's Bochs has the debugger: `c` continues at start. Its terminal
# display wants a terminal, which `script` provides. A powered-off guest
# leaves Bochs running (and a break into its debugger waits on the
# terminal), so the emulator is killed once the guest has powered off or
# the time is up.
printf 'c\n' > "$work/debugger"
echo "booting the guest (Bochs, Tiger Lake model; ${#names[@]} test binaries)" >&2
start=$(date +%s)
(cd "$work" && exec script -qfc "exec bochs -q -f $work/bochsrc < debugger" /dev/null \
    > /dev/null 2>&1) &
emulator=$!
while kill -0 "$emulator" 2>/dev/null && [ $(($(date +%s) - start)) -lt "$timeout_s" ] &&
    ! grep -q 'reboot: Power down' "$serial" 2>/dev/null; do
    sleep 5
done
pkill -KILL -f -- "-f $work/bochsrc" || true
wait "$emulator" || true
echo "the guest ran $(($(date +%s) - start)) s" >&2

# The guest's terminal ends its lines with CR LF.
log=$work/guest.log
tr -d '\r' < "$serial" > "$log"
if ! grep -q '^=== guest done' "$log"; then
    echo "the guest did not finish (timeout ${timeout_s} s or a crash); its serial log ends:" >&2
    tail -n 40 "$log" >&2
    exit 1
fi
sed -n '/^=== guest CPU flags/,/^=== guest done/p' "$log"
failed=0
for t in "${names[@]}"; do
    if ! grep -qx "=== $t rc=0" "$log"; then
        echo "FAILED in the guest: $t" >&2
        failed=1
    fi
done
exit "$failed"
