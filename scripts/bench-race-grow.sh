#!/usr/bin/env bash
# Online resizing of the RACE hash table: load KEYS keys into a table
# created for 1000 keys (it grows by splitting subtables while the load's
# 2 threads × 8 coroutines keep inserting), then run YCSB c for SECONDS;
# the same with a table created for KEYS keys (no splits) as the baseline.
# Both are verified (every key read back, no duplicates). Embedded, then
# loopback TCP with KEYS / 2 keys. Prints load time, splits, final depth,
# subtables per blade, and the run's throughput, with the ratios.
# Usage: scripts/bench-race-grow.sh [SECONDS] [KEYS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-3}
keys=${2:-2000000}
out=${OUT:-results/race-grow}
. scripts/lib.sh
need_seconds SECONDS "$secs"
need_count KEYS "$keys"
prepare "$out"
for backend in embedded tcp; do
  extra=(--blade-size 2GiB --embedded-blades 2)
  n=$keys
  [ "$backend" = tcp ] && n=$((keys / 2))
  for start in 1000 "$n"; do
    if [ "$backend" = tcp ]; then
      # A fresh blade per run: the table must not exist yet.
      start_blade "$out" --size 2GiB
      extra=(--blades "$BLADE_ADDR")
    fi
    echo "$backend: $n keys into a table created for $start" >&2
    "$bin/compute-blade" ycsb "${extra[@]}" --app race --workload c --keys "$n" --capacity "$start" \
      --threads 2 --coroutines 8 --duration "$secs" --warmup 0.5 --verify --quiet \
      --json "$out/$backend-$start.json" >/dev/null
    stop_blade
  done
done
python3 - "$out" "$keys" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
print("| backend | keys | created for | load s | load Mkeys/s | splits | split s | dir lock wait s | depth | subtables per blade | c Mop/s | violations |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for b in ["embedded", "tcp"]:
    rs = sorted((json.load(open(f)) for f in glob.glob(os.path.join(d, f"{b}-*.json"))), key=lambda r: r["capacity"])
    for r in rs:
        print(f"| {b} | {r['keys']} | {r['capacity']} | {r['load_s']:.1f} | {r['keys'] / r['load_s'] / 1e6:.2f} | "
              f"{r['race']['splits']} | {r['race']['split_s']:.1f} | {r['race'].get('dir_wait_s', 0):.2f} | "
              f"{r['race']['depth']} | {r['race']['subtables_per_blade']} | "
              f"{r['throughput_mops']:.3f} | {r['violations']} |")
    g, p = rs[0], rs[-1]
    print(f"| {b} | | **grown ÷ presized** | **{g['load_s'] / p['load_s']:.2f}× time** | | | | | | | "
          f"**{g['throughput_mops'] / p['throughput_mops']:.2f}×** | |")
PY
