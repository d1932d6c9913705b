#!/usr/bin/env bash
# Benchmark (b) of the Smart techniques: 8-byte READ throughput for each QP
# policy (shared, multiplexed:2, per-thread-qp, per-thread-db) at 1, 2, 4
# and 8 threads × 8 coroutines, on the embedded backend and over loopback
# TCP. The soft backends emulate DOORBELLS (LOW:MEDIUM, default 2:2, a
# scaled-down ConnectX whose 4:12 would only be shared past 16 QPs), so
# per-thread-qp threads share doorbells at these thread counts.
# Usage: scripts/bench-qp-policy.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-3}
dbs=${DOORBELLS:-2:2}
out=${OUT:-results/qp-policy}
. scripts/lib.sh
need_seconds SECONDS "$secs"
prepare "$out"
start_blade "$out" --size 256MiB
addr=$BLADE_ADDR
for backend in embedded tcp; do
  for policy in shared multiplexed:2 per-thread-qp per-thread-db; do
    for t in 1 2 4 8; do
      echo "$backend $policy $t threads" >&2
      extra=()
      [ "$backend" = tcp ] && extra=(--blades "$addr")
      "$bin/compute-blade" micro "${extra[@]}" --op read --size 8 --threads "$t" --coroutines 8 \
        --duration "$secs" --warmup 0.5 --qp-policy "$policy" --doorbells "$dbs" --quiet \
        --json "$out/$backend-${policy/:/}-t$t.json" >/dev/null
    done
  done
done
stop_blade
python3 - "$out" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
rows = {}
for p in glob.glob(os.path.join(d, "*.json")):
    r = json.load(open(p))
    rows[(r["transport"], r["qp_policy"], r["threads"])] = r["throughput_mops"]
policies = ["shared", "multiplexed:2", "per-thread-qp", "per-thread-db"]
for backend in ["embedded", "tcp"]:
    print(f"\n{backend} (Mop/s; last column: per-thread-db ÷ per-thread-qp)\n")
    print("| threads | " + " | ".join(policies) + " | db ÷ qp |")
    print("|---" * (len(policies) + 2) + "|")
    for t in [1, 2, 4, 8]:
        v = [rows[(backend, p, t)] for p in policies]
        print(f"| {t} | " + " | ".join(f"{x:.3f}" for x in v) + f" | {v[3] / v[2]:.2f}× |")
PY
