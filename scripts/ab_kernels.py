#!/usr/bin/env python3
"""A/B of one kernels-bench case between two builds, run side by side.

Usage (from the repository root):
    python3 scripts/ab_kernels.py --old REV [--new REV] [--rounds 8] FILTER
    python3 scripts/ab_kernels.py --old-bin PATH --new-bin PATH [--rounds 8] FILTER

FILTER is a criterion filter naming one case of `mllm-ops/benches/kernels.rs`
(for example "packed_prefill/q4_1 ffn prefill128, 16-bit rows, 1 threads/Avx2";
use a one-thread case). With --old/--new the script checks each revision out
into a git worktree under target/ab/, builds the bench binary there (one
cargo target directory for all of them) and removes the worktree once the
binary is copied; without --new or --new-bin the new build is the working
tree as it is. --old-bin/--new-bin name binaries already built instead
(`cargo bench -p mllm-ops --bench kernels --no-run` prints the path).

Why side by side: on a shared 2-core VM the host's speed moves by a third
within minutes, so alternated runs of two builds spread wider than most
kernel changes. Here both builds run at the same time, each pinned to its
own core with `taskset`, and the cores swap every round, so the two numbers
of a round share the host's state. The script then runs the same number of
rounds of the old build against itself (an A/A control) and prints both
spreads: a change is resolved only where its ratios leave the control's.

Needs Linux with `taskset` and at least two cores; prints each round, then
one summary line per set: median ratio new/old and its min-max.
"""
import argparse
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
AB_DIR = ROOT / "target" / "ab"
THROUGHPUT = re.compile(r"thrpt:\s+\[\S+ \S+ (\S+) (\S+)")
UNITS = {"elem/s": 1, "Kelem/s": 1e3, "Melem/s": 1e6, "Gelem/s": 1e9,
         "B/s": 1, "KiB/s": 2**10, "MiB/s": 2**20, "GiB/s": 2**30}


def build(rev):
    """Builds the kernels bench of `rev` (None: the working tree); returns
    the path of a copy of the binary under target/ab/."""
    AB_DIR.mkdir(parents=True, exist_ok=True)
    if rev is None:
        tree, name = ROOT, "worktree"
    else:
        sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
                             cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout.strip()
        tree, name = AB_DIR / f"src-{sha[:12]}", sha[:12]
        if not tree.exists():
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha],
                           cwd=ROOT, check=True, capture_output=True)
    env = dict(os.environ, CARGO_TARGET_DIR=str(AB_DIR / "cargo"))
    out = subprocess.run(
        ["cargo", "bench", "-p", "mllm-ops", "--bench", "kernels", "--no-run",
         "--message-format=short"],
        cwd=tree, env=env, check=True, capture_output=True, text=True)
    found = re.findall(r"\((\S+/deps/kernels-[0-9a-f]+)\)", out.stderr)
    if not found:
        sys.exit(f"no kernels bench binary in cargo's output for {name}:\n{out.stderr}")
    binary = AB_DIR / f"kernels-{name}"
    shutil.copy2(found[-1], binary)
    if rev is not None:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)],
                       cwd=ROOT, check=True, capture_output=True)
    return binary


def throughput(text, what):
    """The median throughput criterion printed first in `text`, per second."""
    m = THROUGHPUT.search(text)
    if not m:
        sys.exit(f"no throughput line from {what}; does the filter name one case "
                 f"with a throughput?\n{text[-2000:]}")
    value, unit = m.groups()
    if unit not in UNITS:
        sys.exit(f"unknown throughput unit {unit!r} from {what}")
    return float(value) * UNITS[unit]


def side_by_side(a, b, case, rounds, label):
    """Per-round ratios b/a of `rounds` rounds of a and b at once, one per
    core, the cores swapped every round."""
    ratios = []
    args = ["--bench", "--noplot", "--warm-up-time", "1", "--measurement-time", "4", case]
    # Each process keeps its criterion data apart, so that neither reads
    # or overwrites the other's files mid-run.
    homes = [AB_DIR / f"criterion-{side}" for side in ("old", "new")]
    for r in range(rounds):
        cores = (0, 1) if r % 2 == 0 else (1, 0)
        procs = [subprocess.Popen(["taskset", "-c", str(core), str(binary), *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=dict(os.environ, CRITERION_HOME=str(home)))
                 for binary, core, home in zip((a, b), cores, homes)]
        outs = [p.communicate()[0] for p in procs]
        for p, out in zip(procs, outs):
            if p.returncode != 0:
                sys.exit(f"the bench failed ({p.returncode}):\n{out[-2000:]}")
        ta, tb = (throughput(o, w) for o, w in zip(outs, ("old", "new")))
        ratios.append(tb / ta)
        print(f"{label} round {r + 1}: old {ta:.4g}/s new {tb:.4g}/s ratio {tb / ta:.3f}",
              flush=True)
    return ratios


def summary(label, ratios):
    return (f"{label}: median ratio {statistics.median(ratios):.3f} "
            f"({min(ratios):.3f}-{max(ratios):.3f}), {len(ratios)} rounds")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case", metavar="FILTER", help="criterion filter naming one case")
    p.add_argument("--old", help="the old revision (built in a worktree)")
    p.add_argument("--new", help="the new revision (default: the working tree)")
    p.add_argument("--old-bin", type=pathlib.Path, help="an old kernels bench binary")
    p.add_argument("--new-bin", type=pathlib.Path, help="a new kernels bench binary")
    p.add_argument("--rounds", type=int, default=8, help="rounds per set (default 8)")
    p.add_argument("--no-control", action="store_true",
                   help="skip the A/A control set (old against old)")
    a = p.parse_args()
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    if (a.old is None) == (a.old_bin is None):
        p.error("give exactly one of --old and --old-bin")
    if a.new is not None and a.new_bin is not None:
        p.error("give at most one of --new and --new-bin")
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        sys.exit("needs `taskset` and at least two cores")
    # Named binaries are checked before any build, which takes minutes.
    for path in (a.old_bin, a.new_bin):
        if path is not None and not path.is_file():
            sys.exit(f"no bench binary at {path}")
    old = a.old_bin if a.old_bin is not None else build(a.old)
    new = a.new_bin if a.new_bin is not None else build(a.new)
    lines = [summary("new/old", side_by_side(old, new, a.case, a.rounds, "A/B"))]
    if not a.no_control:
        lines.append(summary("old/old (control)",
                             side_by_side(old, old, a.case, a.rounds, "A/A")))
    print(f"case: {a.case}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
