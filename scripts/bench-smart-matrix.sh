#!/usr/bin/env bash
# The technique matrix: each Smart technique alone and all together against
# none, for micro READ, contended CAS, YCSB a/b/c/update-only over race-ht
# and YCSB a/c/e over sherman-bt, on the embedded backend and over loopback TCP. Within a round the
# settings of one cell run back to back, in an order that rotates from round
# to round; each cell reports the median over
# ROUNDS of the ratio to the none run of the same round (all measured in
# this run).
#
#   scripts/bench-smart-matrix.sh [ROUNDS] [SECONDS] [BACKENDS]
#
# Each round also runs none a second time (none-again): a cell is relative to
# the mean of the round's two none runs, and a column shows their ratio, the
# noise of that row on this machine.
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
prepare "$out"
rm -f "$out"/*.json
# none-again runs none a second time: the baseline is the mean of the two
# none runs of a round, and their ratio shows the machine's noise per row.
settings=(none thd-res-alloc work-req-throt conflict-avoid spec-lookup all none-again)
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
total=$(( rounds * ${#workloads[@]} * $(wc -w <<<"$backends") * ${#settings[@]} ))
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
      # The order of the settings rotates from round to round, so that no
      # setting always runs first on a fresh blade.
      k=$(( (r - 1) % ${#settings[@]} ))
      for s in "${settings[@]:k}" "${settings[@]:0:k}"; do
        n=$((n + 1))
        echo "[$n/$total] round $r: $backend $name --smart $s" >&2
        # A new table per YCSB run on the shared blade.
        table=()
        [ "${cmd[0]}" = ycsb ] && table=(--table "m$n")
        "$bin/compute-blade" "${cmd[@]}" "${extra[@]}" "${table[@]}" --smart "${s%-again}" --duration "$secs" --warmup 0.5 \
          --quiet --json "$out/$backend-$name-$s-$r.json" >/dev/null
      done
      stop_blade
    done
  done
done
python3 - "$out" "$rounds" "$backends" "${settings[*]}" "$(printf '%s\n' "${workloads[@]%%|*}")" <<'PY' | tee "$out/matrix.md"
import json, os, statistics, sys
d, rounds, backends, settings, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5].split()
def med(backend, name, s, key):
    vals = [json.load(open(os.path.join(d, f"{backend}-{name}-{s}-{r}.json")))[key] for r in range(1, rounds + 1)]
    return statistics.median(vals)
def rec(backend, name, s, r):
    return json.load(open(os.path.join(d, f"{backend}-{name}-{s}-{r}.json")))
def mops(backend, name, s, r):
    return rec(backend, name, s, r)["throughput_mops"]
def paired(backend, name, s):
    # Each round's run against the mean of the two none runs of the same
    # round (all ran back to back), then the median over rounds: slow drifts
    # of a noisy machine cancel.
    return statistics.median(mops(backend, name, s, r) / ((mops(backend, name, "none", r) + mops(backend, name, "none-again", r)) / 2)
                             for r in range(1, rounds + 1))
def noise(backend, name):
    return statistics.median(mops(backend, name, "none-again", r) / mops(backend, name, "none", r) for r in range(1, rounds + 1))
techniques = [s for s in settings if s not in ("none", "none-again")]
worst = []
for b in backends:
    print(f"\n**{b}** (throughput relative to none: median over {rounds} rounds of the ratio, within a round, to the "
          f"mean of that round's two none runs; the last column is the second none run over the first, the noise; "
          f"median Mop/s and retries/op of none and all)\n")
    print("| workload | none Mop/s | " + " | ".join(techniques) + " | none again ÷ none | retries/op none → all |")
    print("|---|---|" + "---|" * len(techniques) + "---|---|")
    for name in names:
        base = med(b, name, "none", "throughput_mops")
        cells = []
        for s in techniques:
            ratio = paired(b, name, s)
            worst.append((ratio, b, name, s))
            cells.append(f"{ratio:.2f}×")
        cells.append(f"{noise(b, name):.2f}×")
        rn, ra = med(b, name, "none", "retries_per_op"), med(b, name, "all", "retries_per_op")
        fewer = f" ({rn / ra:.0f}× fewer)" if ra > 0 and rn > 0 else ""
        print(f"| {name} | {base:.3f} | " + " | ".join(cells) + f" | {rn:.3f} → {ra:.3f}{fewer} |")
w = min(worst)
print(f"\nLowest cell: {w[0]:.2f}× ({w[1]}, {w[2]}, --smart {w[3]}).")
PY
