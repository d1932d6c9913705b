#!/usr/bin/env bash
# SmallBank and TATP (FORD transactions) with --smart all and --smart none,
# on the embedded backend and over loopback TCP (two memory-blade
# processes), 2 threads x 8 coroutines, 2 replicas; plus, on embedded, the
# verbs/s of `compute-blade micro` (8-byte READs, same threads and
# coroutines) for the framework-efficiency ratio: the transactions' verbs/s
# over micro's, micro measured in every round just before the embedded
# runs, the cell the median of the per-round ratios (a busy machine slows
# both alike). All numbers come from this one run: each cell is the median
# over ROUNDS, and all/none the median of the per-round ratios (the two
# settings run back to back, in alternating order, on fresh blades).
#
#   scripts/bench-dtx.sh [SECONDS] [BACKENDS] [ROUNDS]
#
# SECONDS per run (default 3), BACKENDS (default "embedded tcp"), ROUNDS
# (default 3). Records go to $OUT (default results/dtx); the table is
# printed and written to $OUT/dtx.md.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-3}
backends=${2:-embedded tcp}
rounds=${3:-3}
out=${OUT:-results/dtx}
. scripts/lib.sh
need_seconds SECONDS "$secs"
need_words BACKENDS "$backends" embedded tcp
need_count ROUNDS "$rounds"
prepare "$out"
trap kill_blades EXIT
rm -f "$out"/*.json
common=(--threads 2 --coroutines 8 --duration "$secs" --warmup 1 --quiet)
for r in $(seq "$rounds"); do
  order=(all none)
  [ $((r % 2)) = 0 ] && order=(none all)
  for backend in $backends; do
    if [ "$backend" = embedded ]; then
      echo "round $r: micro" >&2
      "$bin/compute-blade" micro --op read --size 8 "${common[@]}" --json "$out/micro-embedded-$r.json" >/dev/null
    fi
    for w in smallbank tatp; do
      for s in "${order[@]}"; do
        extra=()
        if [ "$backend" = tcp ]; then
          start_blades 2 "$out" --size 512MiB
          extra=(--blades "$BLADES")
        fi
        echo "round $r: $backend $w --smart $s" >&2
        "$bin/compute-blade" "$w" "${extra[@]}" --smart "$s" "${common[@]}" --json "$out/$backend-$w-$s-$r.json" >/dev/null
        if [ "$backend" = tcp ]; then stop_blades; fi
      done
    done
  done
done
python3 - "$out" "$rounds" $backends <<'PY' | tee "$out/dtx.md"
import json, os, statistics, sys
out, rounds, backends = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = statistics.median
vps_of = lambda r: r["verbs"]["wrs"] / r["duration_s"]
micro = [vps_of(json.load(open(os.path.join(out, f"micro-embedded-{r}.json")))) if "embedded" in backends else None
         for r in range(1, rounds + 1)]
if "embedded" in backends:
    print(f"micro READ 8 B, embedded, 2 x 8: {med(micro) / 1e6:.2f} M verbs/s "
          f"({', '.join(f'{m / 1e6:.2f}' for m in micro)} by round); medians of {rounds} rounds\n")
print("| backend | workload | smart | committed txn/s | all/none | attempted txn/s | abort rate | p50 us | p99 us | verbs/attempted | verbs/committed | verbs/s vs micro |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
load = lambda b, w, s, r: json.load(open(os.path.join(out, f"{b}-{w}-{s}-{r}.json")))
for b in backends:
    for w in ["smallbank", "tatp"]:
        ratio = med(load(b, w, "all", r)["committed_per_s"] / load(b, w, "none", r)["committed_per_s"]
                    for r in range(1, rounds + 1))
        for s in ["all", "none"]:
            rs = [load(b, w, s, r) for r in range(1, rounds + 1)]
            m = lambda f: med(f(r) for r in rs)
            eff = f"{med(vps_of(r) / micro[i] for i, r in enumerate(rs)):.2f}" if b == "embedded" else "-"
            rat = f"{ratio:.2f}" if s == "all" else ""
            print(f"| {b} | {w} | {s} | {m(lambda r: r['committed_per_s']):,.0f} | {rat} | {m(lambda r: r['attempted_per_s']):,.0f} "
                  f"| {m(lambda r: r['abort_rate']):.3f} | {m(lambda r: r['latency_us']['p50']):.1f} | {m(lambda r: r['latency_us']['p99']):.1f} "
                  f"| {m(lambda r: r['verbs_per_attempted']):.2f} | {m(lambda r: r['verbs_per_committed']):.2f} | {eff} |")
print("\nAborts by type and cause (round 1, " + backends[0] + ", --smart all):\n")
for w in ["smallbank", "tatp"]:
    r = load(backends[0], w, "all", 1)
    print(f"- {w}: " + "; ".join(
        f"{t} {v['committed']}/{v['attempted']} committed"
        + "".join(f", {c} {n}" for c, n in v["aborts"].items() if n)
        for t, v in r["aborts_by_type"].items()))
PY
