#!/usr/bin/env bash
# The performance guard of the memory blade's I/O: compute-blade micro over
# loopback TCP (8-byte READ and FAA, 2 threads × 1, 8, 32 coroutines), this
# tree's blade and compute blade against a baseline commit's, alternating
# per cell so both see the same machine. Prints Mop/s and the ratio per cell.
# Usage: scripts/bench-blade-io.sh [BASE_REV] [SECONDS]
#   BASE_REV defaults to 44c237c; it is built in target/hotpath-base.
set -euo pipefail
cd "$(dirname "$0")/.."
base_rev=${1:-44c237c}
secs=${2:-2}
out=${OUT:-results/blade-io}
mkdir -p "$out"
. scripts/lib.sh
need_rev "$base_rev"
need_seconds SECONDS "$secs"
build_base "$base_rev" target/hotpath-base compute-blade memory-blade
wt=target/hotpath-base

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
# start DIR TAG: a blade from DIR/target/release; its PID joins $pids (in this
# shell, not a subshell, so the trap can end it) and its address is in $addr.
start() {
  "$1/target/release/memory-blade" --listen 127.0.0.1:0 --size 256MiB >"$out/blade-$2.out" 2>/dev/null &
  pids+=($!)
  for _ in $(seq 100); do grep -q '^ready ' "$out/blade-$2.out" 2>/dev/null && break; sleep 0.1; done
  addr=$(awk '/^ready /{print $2}' "$out/blade-$2.out")
  [ -n "$addr" ] || { echo "memory-blade from $1 never printed its ready line" >&2; exit 1; }
}
start "$wt" old
a_old=$addr
start . new
a_new=$addr
echo "| op | coroutines | baseline Mop/s | this tree Mop/s | ratio |"
echo "|---|---|---|---|---|"
for op in read faa; do
  for c in 1 8 32; do
    args=(micro --op "$op" --threads 2 --coroutines "$c" --duration "$secs" --warmup 0.5 --quiet)
    o=$("$wt/target/release/compute-blade" "${args[@]}" --blades "$a_old" | awk '{print $1}')
    n=$(target/release/compute-blade "${args[@]}" --blades "$a_new" | awk '{print $1}')
    python3 -c "o,n=$o,$n; print(f'| $op | $c | {o:.3f} | {n:.3f} | {n/o:.2f}× |')"
  done
done
