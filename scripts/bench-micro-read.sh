#!/usr/bin/env bash
# The foundation benchmark: 8-byte READ throughput on the embedded backend
# (1, 2 threads) and over loopback TCP (1, 2 threads × 1, 8, 32 coroutines).
# Writes one JSON record per run to $OUT (default results/micro-read) and
# prints a Markdown table. Usage: scripts/bench-micro-read.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
out=${OUT:-results/micro-read}
. scripts/lib.sh
need_seconds SECONDS "$secs"
prepare "$out"

for t in 1 2; do
  echo "embedded: $t thread(s)" >&2
  "$bin/compute-blade" micro --op read --size 8 --threads "$t" --coroutines 8 --duration "$secs" --quiet \
    --json "$out/embedded-t$t-c8.json" >/dev/null
done

start_blade "$out" --size 256MiB
addr=$BLADE_ADDR
for t in 1 2; do
  for c in 1 8 32; do
    echo "tcp: $t thread(s) × $c coroutine(s)" >&2
    "$bin/compute-blade" micro --blades "$addr" --op read --size 8 --threads "$t" --coroutines "$c" \
      --duration "$secs" --quiet --json "$out/tcp-t$t-c$c.json" >/dev/null
  done
done
stop_blade

python3 - "$out" <<'PY'
import glob, json, os, sys
rows = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.json")))]
rows.sort(key=lambda r: (r["transport"] != "embedded", r["threads"], r["coroutines"]))
base = {r["threads"]: r["throughput_mops"] for r in rows if r["transport"] == "tcp" and r["coroutines"] == 1}
print("| transport | threads | coroutines | Mop/s | Mop/s per thread | vs 1 coroutine | p50 us | p99 us |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    ratio = f"{r['throughput_mops'] / base[r['threads']]:.1f}×" if r["transport"] == "tcp" and r["threads"] in base else "-"
    l = r["latency_us"]
    print(f"| {r['transport']} | {r['threads']} | {r['coroutines']} | {r['throughput_mops']:.3f} | "
          f"{r['throughput_mops'] / r['threads']:.3f} | {ratio} | {l['p50']:.1f} | {l['p99']:.1f} |")
PY
