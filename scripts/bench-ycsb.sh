#!/usr/bin/env bash
# Issue 4's benchmark: YCSB a, b, c and update-only at Zipf 0.99 over the
# RACE hash table, 2 threads × 8 coroutines (update-only also × 16 and × 32), on the
# embedded backend and over loopback TCP, --smart all vs none. Prints
# throughput, p50/p99, retries per op and verbs per op, and the ratios.
# Usage: scripts/bench-ycsb.sh [SECONDS] [KEYS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
keys=${2:-200000}
out=${OUT:-results/ycsb}
. scripts/lib.sh
need_seconds SECONDS "$secs"
need_count KEYS "$keys"
prepare "$out"
start_blade "$out" --size 2GiB
addr=$BLADE_ADDR
for backend in embedded tcp; do
  for w in a b c update-only update-only-16 update-only-32; do
    for smart in none all; do
      echo "$backend $w --smart $smart" >&2
      extra=(--blade-size 1GiB)
      [ "$backend" = tcp ] && extra=(--blades "$addr")
      co=8; wl=$w
      [ "$w" = update-only-16 ] && { co=16; wl=update-only; }
      [ "$w" = update-only-32 ] && { co=32; wl=update-only; }
      "$bin/compute-blade" ycsb "${extra[@]}" --app race --workload "$wl" --keys "$keys" --zipf 0.99 \
        --threads 2 --coroutines "$co" --duration "$secs" --smart "$smart" --quiet \
        --json "$out/$backend-$w-$smart.json" >/dev/null
    done
  done
done
stop_blade
python3 - "$out" <<'PY'
import json, os, sys
d = sys.argv[1]
print("| backend | workload | coroutines | --smart | Mop/s | p50 us | p99 us | retries/op | verbs/op |")
print("|---|---|---|---|---|---|---|---|---|")
for b in ["embedded", "tcp"]:
    for w in ["a", "b", "c", "update-only", "update-only-16", "update-only-32"]:
        rs = {s: json.load(open(os.path.join(d, f"{b}-{w}-{s}.json"))) for s in ["none", "all"]}
        for s, r in rs.items():
            l = r["latency_us"]
            print(f"| {b} | {r['workload']} | {r['coroutines']} | {s} | {r['throughput_mops']:.3f} | {l['p50']:.1f} | {l['p99']:.1f} | {r['retries_per_op']:.3f} | {r['verbs_per_op']:.2f} |")
        n, a = rs["none"], rs["all"]
        if a["retries_per_op"] > 0:
            fewer = f"**{n['retries_per_op'] / a['retries_per_op']:.1f}× fewer**"
        else:
            fewer = "none either way" if n["retries_per_op"] == 0 else "**none with Smart**"
        print(f"| {b} | {n['workload']} | | **all ÷ none** | **{a['throughput_mops'] / n['throughput_mops']:.2f}×** | | | {fewer} | |")
PY
