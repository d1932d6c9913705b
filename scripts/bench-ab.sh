#!/usr/bin/env bash
# This tree against a baseline commit on any `compute-blade` run: the two
# binaries alternate for ROUNDS rounds (so both see the same machine, whose
# speed drifts by tens of percent between hours here), and the script
# prints each round, the medians, the median of the per-round ratios, their
# range, and a sign test of how many rounds this tree won (p near 1: no
# evidence either way; an A/A run of one commit against itself shows this
# machine's noise).
# What it compares: committed transactions per second for smallbank and
# tatp, operations per second otherwise; and verbs per second.
#
# Usage: scripts/bench-ab.sh BASE_REV ROUNDS -- COMPUTE_BLADE_ARGS...
#   e.g. scripts/bench-ab.sh HEAD~1 6 -- tatp --threads 1 --coroutines 8 --duration 3 --warmup 1
# Builds the baseline in a git worktree under target/ab-base. Each run gets
# `--quiet --json FILE` added; results in $OUT (default results/ab).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 3 ] || [ "$3" != "--" ]; then
  echo "usage: scripts/bench-ab.sh BASE_REV ROUNDS -- COMPUTE_BLADE_ARGS..." >&2
  exit 2
fi
base_rev=$1
rounds=$2
shift 3
case $rounds in
  '' | *[!0-9]* | 0) echo "ROUNDS must be a positive number, not '$rounds'" >&2; exit 2 ;;
esac
out=${OUT:-results/ab}
mkdir -p "$out"
rm -f "$out"/run-*.json

. scripts/lib.sh
build_base "$base_rev" target/ab-base compute-blade
old=$base/compute-blade
new=$new/compute-blade

# The order alternates between rounds (base first in odd rounds, this tree
# first in even ones), so that a drift within a round favours neither.
for r in $(seq "$rounds"); do
  order="base tree"
  [ $((r % 2)) = 0 ] && order="tree base"
  for v in $order; do
    bin=$new
    [ "$v" = base ] && bin=$old
    "$bin" "$@" --quiet --json "$out/run-$v-$r.json" >/dev/null
    echo "round $r: $v done" >&2
  done
done

python3 - "$out" "$rounds" "$base_rev" <<'PY'
import json, statistics, sys
from math import comb
out, rounds, base = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(v, r):
    t = json.load(open(f"{out}/run-{v}-{r}.json"))
    rate = t["committed_per_s"] if "committed_per_s" in t else t["throughput_mops"] * 1e6
    return rate, t["verbs"]["wrs"] / t["duration_s"]
rows = [(load("base", r), load("tree", r)) for r in range(1, rounds + 1)]
what = "committed txn/s" if "committed_per_s" in json.load(open(f"{out}/run-base-1.json")) else "op/s"
print(f"| round | base {what} | tree {what} | ratio | base verbs/s | tree verbs/s |")
print("|---|---|---|---|---|---|")
for r, ((a, va), (b, vb)) in enumerate(rows, 1):
    print(f"| {r} | {a:,.0f} | {b:,.0f} | {b / a:.3f} | {va:,.0f} | {vb:,.0f} |")
med = lambda xs: statistics.median(xs)
print(f"| **median** | {med(a for (a, _), _ in rows):,.0f} | {med(b for _, (b, _) in rows):,.0f} | "
      f"**{med(b / a for (a, _), (b, _) in rows):.3f}** | {med(va for (_, va), _ in rows):,.0f} | "
      f"{med(vb for _, (_, vb) in rows):,.0f} |")
faster = sum(b > a for (a, _), (b, _) in rows)
ratios = [b / a for (a, _), (b, _) in rows]
# Two-sided sign test: how likely so lopsided a count of faster rounds is
# when the two builds are equally fast (each round a coin flip).
k = min(faster, rounds - faster)
p = min(1.0, 2 * sum(comb(rounds, i) for i in range(k + 1)) / 2 ** rounds)
print(f"\nthis tree ÷ {base}: median of {rounds} per-round ratios; faster in {faster} of {rounds} rounds "
      f"(sign test p = {p:.2f}); per-round ratios {min(ratios):.3f} to {max(ratios):.3f}")
PY
