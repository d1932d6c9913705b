#!/usr/bin/env bash
# Real records on both indexes: YCSB c and a at 2 threads × 8 coroutines on
# the embedded backend and over loopback TCP, at 8/8 bytes (the paper's),
# 24/100 (YCSB's key, one field) and 24/1000 (YCSB's record: keys
# `user` + 20 digits, 10 fields of 100 bytes), sherman-bt against race-ht,
# with --smart none and spec-lookup. Each run loads a fresh index. Prints
# throughput, bytes read per op and per lookup (the B+tree's), the
# speculative hit rate, and the bytes of the entry a speculative hit
# reads. Then the memory of a delete-heavy run (workload churn, 24/1000,
# over TCP, each index on a fresh blade): the blade heap's high-water mark
# against what the index holds at the end and what is free-listed for
# reuse (`table check`).
# Usage: scripts/bench-records.sh [SECONDS] [KEYS] [BACKENDS]
#   defaults: 3, 100000, "embedded tcp"
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-3}
keys=${2:-100000}
backends=${3:-"embedded tcp"}
out=${OUT:-results/records}
. scripts/lib.sh
need_seconds SECONDS "$secs"
need_count KEYS "$keys"
need_words BACKENDS "$backends" embedded tcp
prepare "$out"
rm -f "$out"/*.json "$out"/*.txt
start_blade "$out" --size 2GiB
addr=$BLADE_ADDR
sizes=("binary 8 8" "ycsb 24 100" "ycsb 24 1000")
for backend in $backends; do
  for size in "${sizes[@]}"; do
    read -r rec k v <<<"$size"
    for w in c a; do
      for app in sherman race; do
        for smart in none spec-lookup; do
          name="$backend-$app-$w-$k-$v-$smart"
          echo "$name" >&2
          extra=(--blade-size 2GiB)
          [ "$backend" = tcp ] && extra=(--blades "$addr")
          "$bin/compute-blade" ycsb "${extra[@]}" --app "$app" --workload "$w" --keys "$keys" --record "$rec" \
            --key-size "$k" --value-size "$v" --threads 2 --coroutines 8 --duration "$secs" --smart "$smart" \
            --table "$name" --quiet --json "$out/$name.json" >/dev/null
          if [ "$backend" = tcp ]; then
            "$bin/compute-blade" table drop --blades "$addr" --app "$app" "$name" >/dev/null
          fi
        done
      done
    done
  done
done
stop_blade
# Churn, each index on a fresh blade (so the heap is its own): every key
# replaced several times over (the run's inserts, printed).
for app in sherman race; do
  start_blade "$out" --size 2GiB
  addr=$BLADE_ADDR
  echo "churn $app" >&2
  "$bin/compute-blade" ycsb --blades "$addr" --app "$app" --workload churn --keys "$keys" --record ycsb \
    --threads 2 --coroutines 8 --duration "$((secs * 4))" --table "churn-$app" --verify --quiet \
    --json "$out/churn-$app.json" >/dev/null
  "$bin/compute-blade" table check --blades "$addr" --app "$app" "churn-$app" > "$out/churn-$app-check.txt"
  stop_blade
done
python3 - "$out" "$backends" <<'PY'
import json, os, re, sys
d, backends = sys.argv[1], sys.argv[2].split()
rec = lambda n: json.load(open(os.path.join(d, n + ".json")))
print("| backend | workload | key/value | index | --smart | Mop/s | bytes read/op | B+tree bytes/lookup | spec hits |")
print("|---|---|---|---|---|---|---|---|---|")
for b in backends:
    for (k, v) in [(8, 8), (24, 100), (24, 1000)]:
        for w in ["c", "a"]:
            for app in ["sherman", "race"]:
                for s in ["none", "spec-lookup"]:
                    r = rec(f"{b}-{app}-{w}-{k}-{v}-{s}")
                    assert r["violations"] == 0, r
                    st = r[app]
                    bpl = f"{st['bytes_per_lookup']:.0f}" if app == "sherman" else "-"
                    hit = f"{st['spec_hit_rate']:.3f}" if s != "none" and "spec_hit_rate" in st else "-"
                    print(f"| {b} | {w} | {k}/{v} | {app} | {s} | {r['throughput_mops']:.3f} | "
                          f"{r['bytes_read_per_op']:.0f} | {bpl} | {hit} |")
print()
print("| churn (24/1000, TCP) | ops | keys replaced | heap high-water MiB | index holds MiB | free-listed MiB | neither MiB |")
print("|---|---|---|---|---|---|---|")
mib = lambda x: f"{x / 2**20:.1f}"
for app in ["sherman", "race"]:
    r = rec(f"churn-{app}")
    assert r["violations"] == 0, r
    text = open(os.path.join(d, f"churn-{app}-check.txt")).read()
    heap, free, neither = map(int, re.search(r"blade heap: (\d+) bytes in use, (\d+) of them free-listed for reuse, (\d+) neither", text).groups())
    held = heap - free - neither
    print(f"| {app} | {r['ops']} | {r['ops'] // 2} | {mib(heap)} | {mib(held)} | {mib(free)} | {mib(neither)} |")
PY
