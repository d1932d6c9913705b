#!/usr/bin/env bash
# The technique matrix: each Smart technique alone and all together against
# none, for micro READ, contended CAS, YCSB a/b/c/update-only over race-ht
# and YCSB a/c/e over sherman-bt, on the embedded backend and over loopback
# TCP.
#
#   scripts/bench-smart-matrix.sh [ROUNDS] [SECONDS] [BACKENDS]
#
# Within a round, a cell's runs go none, T1, none, T2, ..., T5, none: every
# technique run sits between two none runs, and its ratio is to the mean of
# those two, so a drift of the machine's speed within the round (seconds
# long on a shared 2-core host) cancels. The techniques' order rotates from
# round to round; a cell reports the median over ROUNDS of its ratios. The
# "none ÷ none" column is the median over rounds of the last none run over
# the first, the noise of that row on this machine.
#
# ROUNDS (default 3), SECONDS per run (default 2), BACKENDS (default
# "embedded tcp"). ONLY=read,ycsb-a (workload names, comma-separated) runs
# those rows alone, e.g. to rerun a doubtful row with more rounds. Records
# go to $OUT (default results/smart-matrix), one JSON file per run; the
# table is printed and written to $OUT/matrix.md.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
secs=${2:-2}
backends=${3:-embedded tcp}
out=${OUT:-results/smart-matrix}
. scripts/lib.sh
need_count ROUNDS "$rounds"
need_seconds SECONDS "$secs"
need_words BACKENDS "$backends" embedded tcp
prepare "$out"
rm -f "$out"/*.json "$out"/*-order-*.txt
techniques=(thd-res-alloc work-req-throt conflict-avoid spec-lookup all)
# name | subcommand and its arguments
workloads=(
  "read|micro --op read --size 8 --threads 2 --coroutines 32"
  "cas|micro --op cas --contended --threads 2 --coroutines 16"
  "ycsb-a|ycsb --workload a --keys 50000 --threads 2 --coroutines 16"
  "ycsb-b|ycsb --workload b --keys 50000 --threads 2 --coroutines 16"
  "ycsb-c|ycsb --workload c --keys 50000 --threads 2 --coroutines 16"
  "upd-16|ycsb --workload update-only --keys 50000 --threads 2 --coroutines 16"
  "upd-32|ycsb --workload update-only --keys 50000 --threads 2 --coroutines 32"
  "bt-a|ycsb --app sherman --workload a --keys 50000 --threads 2 --coroutines 16"
  "bt-c|ycsb --app sherman --workload c --keys 50000 --threads 2 --coroutines 16"
  "bt-e|ycsb --app sherman --workload e --keys 50000 --threads 2 --coroutines 16"
)
if [ -n "${ONLY:-}" ]; then
  chosen=()
  for w in "${workloads[@]}"; do
    [[ ",$ONLY," == *",${w%%|*},"* ]] && chosen+=("$w")
  done
  [ ${#chosen[@]} -gt 0 ] || { echo "ONLY=$ONLY names no workload of this script" >&2; exit 2; }
  workloads=("${chosen[@]}")
fi
total=$(( rounds * ${#workloads[@]} * $(wc -w <<<"$backends") * (2 * ${#techniques[@]} + 1) ))
n=0
for r in $(seq "$rounds"); do
  for backend in $backends; do
    for w in "${workloads[@]}"; do
      # A fresh blade for each cell's settings (YCSB tables fill a blade).
      extra=()
      if [ "$backend" = tcp ]; then
        start_blade "$out" --size 2GiB
        extra=(--blades "$BLADE_ADDR")
      fi
      name=${w%%|*}
      # shellcheck disable=SC2206
      cmd=(${w#*|})
      # The techniques' order rotates from round to round; none runs
      # before, between and after them (none-0 ... none-5).
      k=$(( (r - 1) % ${#techniques[@]} ))
      order=("${techniques[@]:k}" "${techniques[@]:0:k}")
      echo "${order[*]}" >"$out/$backend-$name-order-$r.txt"
      runs=(none-0)
      for i in "${!order[@]}"; do
        runs+=("${order[$i]}" "none-$((i + 1))")
      done
      for s in "${runs[@]}"; do
        n=$((n + 1))
        echo "[$n/$total] round $r: $backend $name --smart $s" >&2
        # A new table per YCSB run on the shared blade.
        table=()
        [ "${cmd[0]}" = ycsb ] && table=(--table "m$n")
        "$bin/compute-blade" "${cmd[@]}" "${extra[@]}" "${table[@]}" --smart "${s%-[0-9]}" --duration "$secs" --warmup 0.5 \
          --quiet --json "$out/$backend-$name-$s-$r.json" >/dev/null
      done
      stop_blade
    done
  done
done
python3 - "$out" "$rounds" "$backends" "${techniques[*]}" "$(printf '%s\n' "${workloads[@]%%|*}")" <<'PY' | tee "$out/matrix.md"
import json, os, statistics, sys
d, rounds, backends, techniques, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5].split()
med = statistics.median
def rec(backend, name, s, r):
    return json.load(open(os.path.join(d, f"{backend}-{name}-{s}-{r}.json")))
def mops(backend, name, s, r):
    return rec(backend, name, s, r)["throughput_mops"]
def order(backend, name, r):
    return open(os.path.join(d, f"{backend}-{name}-order-{r}.txt")).read().split()
def paired(backend, name, s):
    # Each run against the mean of the none runs just before and after it,
    # then the median over rounds.
    ratios = []
    for r in range(1, rounds + 1):
        p = order(backend, name, r).index(s)
        ratios.append(mops(backend, name, s, r) / ((mops(backend, name, f"none-{p}", r) + mops(backend, name, f"none-{p + 1}", r)) / 2))
    return med(ratios)
last = f"none-{len(techniques)}"
def noise(backend, name):
    return med(mops(backend, name, last, r) / mops(backend, name, "none-0", r) for r in range(1, rounds + 1))
worst = []
for b in backends:
    print(f"\n**{b}** (throughput relative to none: median over {rounds} rounds of a run's ratio to the mean of the "
          f"none runs just before and after it; \"none ÷ none\" is the round's last none run over its first, the "
          f"noise; median Mop/s of all none runs; median retries/op of the first none run and of all)\n")
    print("| workload | none Mop/s | " + " | ".join(techniques) + " | none ÷ none | retries/op none → all |")
    print("|---|---|" + "---|" * len(techniques) + "---|---|")
    for name in names:
        base = med(mops(b, name, f"none-{i}", r) for r in range(1, rounds + 1) for i in range(len(techniques) + 1))
        cells = []
        for s in techniques:
            ratio = paired(b, name, s)
            worst.append((ratio, b, name, s))
            cells.append(f"{ratio:.2f}×")
        cells.append(f"{noise(b, name):.2f}×")
        rn = med(rec(b, name, "none-0", r)["retries_per_op"] for r in range(1, rounds + 1))
        ra = med(rec(b, name, "all", r)["retries_per_op"] for r in range(1, rounds + 1))
        fewer = f" ({rn / ra:.0f}× fewer)" if ra > 0 and rn > 0 else ""
        print(f"| {name} | {base:.3f} | " + " | ".join(cells) + f" | {rn:.3f} → {ra:.3f}{fewer} |")
w = min(worst)
print(f"\nLowest cell: {w[0]:.3f}× ({w[1]}, {w[2]}, --smart {w[3]}); cells below 0.95×: {sum(x[0] < 0.95 for x in worst)} of {len(worst)}.")
PY
