#!/usr/bin/env bash
# Benchmark (a) of the Smart techniques: a contended CAS-increment counter,
# 2 threads × 16 coroutines, --smart none vs --smart conflict-avoid, on the
# embedded backend and over loopback TCP. Prints retries per op and
# throughput, and the ratios between the two settings measured in this run.
# Usage: scripts/bench-conflict.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
out=${OUT:-results/conflict}
. scripts/lib.sh
need_seconds SECONDS "$secs"
prepare "$out"
start_blade "$out" --size 64MiB
addr=$BLADE_ADDR
for backend in embedded tcp; do
  for smart in none conflict-avoid; do
    echo "$backend, --smart $smart" >&2
    extra=()
    [ "$backend" = tcp ] && extra=(--blades "$addr")
    "$bin/compute-blade" micro "${extra[@]}" --op cas --contended --threads 2 --coroutines 16 \
      --duration "$secs" --smart "$smart" --quiet --json "$out/$backend-$smart.json" >/dev/null
  done
done
stop_blade
python3 - "$out" <<'PY'
import json, os, sys
d = sys.argv[1]
print("| backend | --smart | Mop/s | retries/op | p50 us | p99 us | violations | final backoff cap (us) / n_max per thread |")
print("|---|---|---|---|---|---|---|---|")
for b in ["embedded", "tcp"]:
    rs = {s: json.load(open(os.path.join(d, f"{b}-{s}.json"))) for s in ["none", "conflict-avoid"]}
    for s, r in rs.items():
        st = ", ".join(f"{(x['backoff_cap_ns'] or 0)/1000:.0f}/{x['n_max']}" for x in r["smart_state"]) if s != "none" else "-"
        l = r["latency_us"]
        print(f"| {b} | {s} | {r['throughput_mops']:.3f} | {r['retries_per_op']:.2f} | {l['p50']:.1f} | {l['p99']:.1f} | {r['violations']} | {st} |")
    n, c = rs["none"], rs["conflict-avoid"]
    fewer = n["retries_per_op"] / max(c["retries_per_op"], 1e-9)
    print(f"| {b} | **ratio** | **{c['throughput_mops'] / n['throughput_mops']:.1f}× throughput** | **{fewer:.0f}× fewer retries** | | | | |")
PY
