#!/usr/bin/env bash
# The per-operation cost of the runtime, this tree against a baseline commit:
# `compute-blade micro --op read --threads 1 --coroutines 8` on the embedded
# backend (one 8-byte READ per batch, so every verb goes through the whole
# post → execute → complete → wake path).
#
# 1. Time: ROUNDS rounds, each running the baseline and then this tree for
#    SECONDS, so both see the same machine, on a cached 64 KiB area and on
#    the default 16 MiB one; prints Mop/s and ns/op per round, the medians
#    and their ratios.
# 2. Instructions: each binary once under `valgrind --tool=callgrind`
#    (repeatable on a noisy machine); instructions of the worker thread
#    divided by the batches it posted (calls of the embedded endpoint's
#    `post`, one per operation, a dynamic call that is never inlined), so
#    start-up and the harness thread are excluded.
#
# Usage: scripts/bench-hotpath.sh [BASE_REV] [ROUNDS] [SECONDS]
#   BASE_REV defaults to 44c237c (main before the runtime's module split).
# Builds the baseline in a git worktree under target/hotpath-base.
set -euo pipefail
cd "$(dirname "$0")/.."
base_rev=${1:-44c237c}
rounds=${2:-5}
secs=${3:-3}
out=${OUT:-results/hotpath}
mkdir -p "$out"
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }

. scripts/lib.sh
need_rev "$base_rev"
need_count ROUNDS "$rounds"
need_seconds SECONDS "$secs"
build_base "$base_rev" target/hotpath-base compute-blade
old=$base/compute-blade
new=$new/compute-blade

# Two areas, alternated within each round: 64 KiB, whose lines stay cached,
# so the run measures the runtime's path and not memory latency (blade
# regions are populated); and micro's default 16 MiB, whose random READs
# miss the core's caches (the command as a user runs it).
args=(micro --op read --size 8 --threads 1 --coroutines 8 --warmup 0.5 --quiet)
echo "| round | area | baseline Mop/s | this tree Mop/s | baseline ns/op | this tree ns/op |"
echo "|---|---|---|---|---|---|"
: >"$out/rounds.txt"
for r in $(seq "$rounds"); do
  for area in 64KiB 16MiB; do
    a=$("$old" "${args[@]}" --area "$area" --duration "$secs" | awk '{print $1}')
    b=$("$new" "${args[@]}" --area "$area" --duration "$secs" | awk '{print $1}')
    echo "$area $a $b" >>"$out/rounds.txt"
    python3 -c "a,b=$a,$b; print(f'| $r | $area | {a:.3f} | {b:.3f} | {1e3/a:.0f} | {1e3/b:.0f} |')"
  done
done
python3 - "$out/rounds.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
medians = {area: [statistics.median(float(r[k]) for r in rows if r[0] == area) for k in (1, 2)]
           for area in ("64KiB", "16MiB")}
for area, (a, b) in medians.items():
    print(f"| **median** | {area} | {a:.3f} | {b:.3f} | {1e3/a:.0f} | {1e3/b:.0f} |")
for area, (a, b) in medians.items():
    print(f"\nthis tree ÷ baseline, {area} area: **{b / a:.2f}×** throughput")
PY

# Instructions per operation (worker thread only).
irop() {
  local bin=$1 tag=$2
  rm -f "$out/cg.$tag".*
  valgrind --tool=callgrind --fair-sched=yes --separate-threads=yes --callgrind-out-file="$out/cg.$tag.%p" \
    "$bin" "${args[@]}" --area 64KiB --duration 2 >/dev/null 2>&1
  local f
  f=$(ls "$out/cg.$tag".*-02 | head -1)
  local total calls
  total=$(awk '/^totals:/{print $2}' "$f")
  calls=$(callgrind_annotate --tree=calling "$f" 2>/dev/null |
    grep -E 'EmbeddedEndpoint as smart_core::backend::Endpoint>::post \(' | head -1 |
    grep -oE '\(([0-9,]+)x\)' | tr -d '(),x')
  python3 -c "print(round($total / $calls))"
}
ia=$(irop "$old" base)
ib=$(irop "$new" new)
echo
echo "| instructions per operation (callgrind, worker thread) | baseline | this tree | ratio |"
echo "|---|---|---|---|"
python3 -c "print(f'| micro read, 1 thread × 8 coroutines, 64 KiB area | $ia | $ib | {$ib/$ia:.2f}× |')"
