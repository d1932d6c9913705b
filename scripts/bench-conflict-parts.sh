#!/usr/bin/env bash
# ConflictAvoid part by part, as the steps of the paper's figure 14: RACE
# update-only (Zipf 0.99), 2 threads x 8 coroutines, without ConflictAvoid
# (thd-res-alloc,work-req-throt) and with each --conflict-avoid-parts step
# (backoff, dyn-limit, all), on the embedded backend and over loopback TCP.
# The steps alternate within each round, in an order that turns every round.
# Prints per backend and step the median throughput and retries per
# operation over the rounds, and throughput over "without" (the median of
# the per-round ratios, and their range).
# Usage: scripts/bench-conflict-parts.sh [SECONDS] [ROUNDS]   (3 s, 3 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-3}
rounds=${2:-3}
out=${OUT:-results/conflict-parts}
. scripts/lib.sh
need_seconds SECONDS "$secs"
need_count ROUNDS "$rounds"
prepare "$out"
rm -f "$out"/*.json
start_blade "$out" --size 1GiB
steps=(without backoff dyn-limit all)
for r in $(seq "$rounds"); do
  for backend in embedded tcp; do
    for i in 0 1 2 3; do
      step=${steps[$(((i + r) % 4))]}
      args=(ycsb --app race --workload update-only --keys 100000 --threads 2 --coroutines 8
        --duration "$secs" --warmup 1 --quiet --json "$out/$backend-$step-$r.json")
      if [ "$step" = without ]; then
        args+=(--smart thd-res-alloc,work-req-throt)
      else
        args+=(--smart thd-res-alloc,work-req-throt,conflict-avoid --conflict-avoid-parts "$step")
      fi
      [ "$backend" = tcp ] && args+=(--blades "$BLADE_ADDR" --table "parts-$step-$r")
      echo "round $r/$rounds: $backend, $step" >&2
      "$bin/compute-blade" "${args[@]}" >/dev/null
      if [ "$backend" = tcp ]; then
        "$bin/compute-blade" table drop "parts-$step-$r" --blades "$BLADE_ADDR" --quiet >/dev/null
      fi
    done
  done
done
stop_blade
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
steps = ["without", "backoff", "dyn-limit", "all"]
print("| backend | step | Mop/s | retries/op | p99 us | ÷ without (median, range) |")
print("|---|---|---|---|---|---|")
for b in ["embedded", "tcp"]:
    recs = {s: [json.load(open(f"{d}/{b}-{s}-{r}.json")) for r in range(1, rounds + 1)] for s in steps}
    for s in steps:
        rs = recs[s]
        if any(r.get("errors") or r.get("violations") for r in rs):
            sys.exit(f"{b} {s}: a run reported errors or violations")
        ratios = [r["throughput_mops"] / w["throughput_mops"] for r, w in zip(rs, recs["without"])]
        med = lambda k: statistics.median(r[k] for r in rs)
        p99 = statistics.median(r["latency_us"]["p99"] for r in rs)
        print(f"| {b} | {s} | {med('throughput_mops'):.3f} | {med('retries_per_op'):.3f} | {p99:.0f} | "
              f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) |")
PY
