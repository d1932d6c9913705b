#!/usr/bin/env bash
# The B+tree's benchmark: YCSB a, b, c and e at Zipf 0.99 over sherman-bt,
# 2 threads × 8 coroutines, on the embedded backend and over loopback TCP,
# with --smart none, spec-lookup alone, and all. Each run loads a fresh
# tree. Within a round the three settings run back to back, in an order that
# rotates from round to round; the ratio to none is taken within a round,
# and the table shows medians over rounds. Prints throughput, p50/p99, verbs
# and bytes read per op, the index-cache and speculative hit rates, and the
# ratios to none.
# Usage: scripts/bench-btree.sh [SECONDS] [KEYS] [WORKLOADS] [ROUNDS] [BACKENDS]
#   defaults: 5, 200000, "a b c e", 1, "embedded tcp"
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
keys=${2:-200000}
workloads=${3:-"a b c e"}
rounds=${4:-1}
backends=${5:-"embedded tcp"}
out=${OUT:-results/btree}
. scripts/lib.sh
need_seconds SECONDS "$secs"
need_count KEYS "$keys"
need_words WORKLOADS "$workloads" a b c d e f update-only
need_count ROUNDS "$rounds"
need_words BACKENDS "$backends" embedded tcp
prepare "$out"
rm -f "$out"/*.json
start_blade "$out" --size 1GiB
addr=$BLADE_ADDR
settings=(none spec-lookup all)
for r in $(seq "$rounds"); do
  k=$(( (r - 1) % ${#settings[@]} ))
  for backend in $backends; do
    for w in $workloads; do
      for smart in "${settings[@]:k}" "${settings[@]:0:k}"; do
        echo "round $r: $backend $w --smart $smart" >&2
        extra=(--blade-size 1GiB)
        [ "$backend" = tcp ] && extra=(--blades "$addr")
        "$bin/compute-blade" ycsb "${extra[@]}" --app sherman --workload "$w" --keys "$keys" --zipf 0.99 \
          --threads 2 --coroutines 8 --duration "$secs" --smart "$smart" --table "bt-$r-$backend-$w-$smart" --quiet \
          --json "$out/$backend-$w-$smart-$r.json" >/dev/null
      done
    done
  done
done
stop_blade
python3 - "$out" "$workloads" "$rounds" "$backends" <<'PY'
import json, os, statistics, sys
d, workloads, rounds, backends = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4].split()
rec = lambda b, w, s, r: json.load(open(os.path.join(d, f"{b}-{w}-{s}-{r}.json")))
med = lambda xs: statistics.median(list(xs))
print(f"medians over {rounds} round(s); ÷ none is the median of the within-round ratios\n")
print("| backend | workload | --smart | Mop/s | p50 us | p99 us | verbs/op | bytes read/op | cache hits | spec hits | ÷ none |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for b in backends:
    for w in workloads:
        for s in ["none", "spec-lookup", "all"]:
            rs = [rec(b, w, s, r) for r in range(1, rounds + 1)]
            m = lambda f: med(f(r) for r in rs)
            ratio = med(rec(b, w, s, r)["throughput_mops"] / rec(b, w, "none", r)["throughput_mops"] for r in range(1, rounds + 1))
            spec = f"{m(lambda r: r['sherman']['spec_hit_rate']):.3f}" if s != "none" else "-"
            print(f"| {b} | {w} | {s} | {m(lambda r: r['throughput_mops']):.3f} | {m(lambda r: r['latency_us']['p50']):.1f} | "
                  f"{m(lambda r: r['latency_us']['p99']):.1f} | {m(lambda r: r['verbs_per_op']):.2f} | "
                  f"{m(lambda r: r['bytes_read_per_op']):.0f} | {m(lambda r: r['sherman']['cache_hit_rate']):.3f} | {spec} | "
                  f"**{ratio:.2f}×** |")
PY
