#!/usr/bin/env bash
# The simulator's own speed: simulated verbs per wall-clock second on one
# core of this machine, for micro (8-byte READs) and YCSB A over race-ht,
# both at 96 threads x 8 coroutines on --transport sim.
#
#   scripts/bench-sim.sh [MS]
#
# Each workload runs twice, measuring MS and 2 x MS of virtual time (default
# 10) after 0.5 ms of warm-up; the record's sim.verbs_per_wall_s counts the
# whole process (blade set-up and the YCSB load included), and the
# difference between the two runs gives the steady state: the extra verbs
# over the extra wall time. Also times a 96-thread figure point of 20 ms
# (virtual) from start to end. Records go to $OUT (default
# results/bench-sim); prints a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
ms=${1:-10}
[[ $ms =~ ^[1-9][0-9]*$ ]] || { echo "usage: scripts/bench-sim.sh [MS] (virtual milliseconds, a positive whole number)" >&2; exit 2; }
out=${OUT:-results/bench-sim}
mkdir -p "$out"
cargo build --release --quiet --bin compute-blade
bin=target/release/compute-blade
common=(--transport sim --threads 96 --coroutines 8 --warmup 0.0005 --seed 1 --quiet)
declare -A runs=(
  [micro]="micro --op read --size 8"
  [ycsb-race-a]="ycsb --app race --workload a --keys 100000"
)
for name in micro ycsb-race-a; do
  for k in 1 2; do
    secs=$(python3 -c "print($k * $ms / 1000)")
    echo "$name: $((k * ms)) ms (virtual)" >&2
    # shellcheck disable=SC2086 # the workload's words
    "$bin" ${runs[$name]} "${common[@]}" --duration "$secs" --json "$out/$name-$k.json" >/dev/null
  done
done
echo "a figure point: ycsb race a, 96 x 8, 20 ms (virtual)" >&2
t0=$(date +%s.%N)
"$bin" ycsb --app race --workload a --keys 100000 "${common[@]}" --duration 0.02 --json "$out/point.json" >/dev/null
t1=$(date +%s.%N)
python3 - "$out" "$ms" "$t0" "$t1" <<'EOF'
import json, sys
out, ms, t0, t1 = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
print("| workload (96 threads x 8 coroutines) | virtual ms | verbs | wall s | verbs per wall s (whole run) | steady state (2 runs' difference) |")
print("|---|---|---|---|---|---|")
for name in ("micro", "ycsb-race-a"):
    a, b = (json.load(open(f"{out}/{name}-{k}.json"))["sim"] for k in (1, 2))
    steady = (b["verbs"] - a["verbs"]) / max(b["wall_s"] - a["wall_s"], 1e-9)
    for k, s in ((1, a), (2, b)):
        cell = f"{steady / 1e6:.2f} M" if k == 2 else ""
        print(f"| {name} | {k * ms} | {s['verbs']} | {s['wall_s']:.2f} | {s['verbs_per_wall_s'] / 1e6:.2f} M | {cell} |")
p = json.load(open(f"{out}/point.json"))
print(f"\nA figure point (ycsb race a, 96 x 8, 20 ms virtual, 100 000 keys loaded): {t1 - t0:.1f} s from start to end; "
      f"{p['throughput_mops']:.2f} Mop/s simulated.")
EOF
