#!/usr/bin/env bash
# SmallBank and TATP (FORD transactions) with --smart all and --smart none,
# on the embedded backend and over loopback TCP (two memory-blade
# processes), 2 threads x 8 coroutines, 2 replicas; plus, on embedded, the
# verbs/s of `compute-blade micro` (8-byte READs, same threads and
# coroutines) for the framework-efficiency ratio: the transactions' verbs/s
# over micro's. All numbers come from this one run.
#
#   scripts/bench-dtx.sh [SECONDS] [BACKENDS]
#
# SECONDS per run (default 3), BACKENDS (default "embedded tcp"). Records
# go to $OUT (default results/dtx); the table is printed and written to
# $OUT/dtx.md.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-3}
backends=${2:-embedded tcp}
out=${OUT:-results/dtx}
. scripts/lib.sh
prepare "$out"
trap kill_blades EXIT
rm -f "$out"/*.json
common=(--threads 2 --coroutines 8 --duration "$secs" --warmup 1 --quiet)
"$bin/compute-blade" micro --op read --size 8 "${common[@]}" --json "$out/micro-embedded.json" >/dev/null
for backend in $backends; do
  for w in smallbank tatp; do
    for s in all none; do
      extra=()
      if [ "$backend" = tcp ]; then
        start_blades 2 "$out" --size 512MiB
        extra=(--blades "$BLADES")
      fi
      echo "$backend $w --smart $s" >&2
      "$bin/compute-blade" "$w" "${extra[@]}" --smart "$s" "${common[@]}" --json "$out/$backend-$w-$s.json" >/dev/null
      [ "$backend" = tcp ] && stop_blades
    done
  done
done
python3 - "$out" $backends <<'PY' | tee "$out/dtx.md"
import json, os, sys
out, backends = sys.argv[1], sys.argv[2:]
micro = json.load(open(os.path.join(out, "micro-embedded.json")))
micro_vps = micro["verbs"]["wrs"] / micro["duration_s"]
print(f"micro READ 8 B, embedded, 2 x 8: {micro_vps / 1e6:.2f} M verbs/s\n")
print("| backend | workload | smart | committed txn/s | attempted txn/s | abort rate | p50 us | p99 us | verbs/attempted | verbs/committed | verbs/s vs micro |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for b in backends:
    for w in ["smallbank", "tatp"]:
        for s in ["all", "none"]:
            r = json.load(open(os.path.join(out, f"{b}-{w}-{s}.json")))
            vps = r["verbs"]["wrs"] / r["duration_s"]
            ratio = f"{vps / micro_vps:.2f}" if b == "embedded" else "-"
            l = r["latency_us"]
            print(f"| {b} | {w} | {s} | {r['committed_per_s']:,.0f} | {r['attempted_per_s']:,.0f} | {r['abort_rate']:.3f} "
                  f"| {l['p50']:.1f} | {l['p99']:.1f} | {r['verbs_per_attempted']:.2f} | {r['verbs_per_committed']:.2f} | {ratio} |")
print("\nAborts by type and cause (embedded, --smart all):\n")
for w in ["smallbank", "tatp"]:
    path = os.path.join(out, f"{backends[0]}-{w}-all.json")
    r = json.load(open(path))
    print(f"{w}: " + "; ".join(
        f"{t} {v['committed']}/{v['attempted']} committed"
        + "".join(f", {c} {n}" for c, n in v["aborts"].items() if n)
        for t, v in r["aborts_by_type"].items()))
PY
