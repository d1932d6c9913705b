#!/usr/bin/env bash
# Instructions per attempted transaction of `compute-blade tatp` or
# `smallbank` on the embedded backend, counted by callgrind (repeatable on
# a noisy machine, where timings are not). Counting starts once the
# database is loaded (callgrind_control turns instrumentation on at the
# run's "loaded in" line), and the total is divided by the calls of the
# workload's `draw`: one per attempt, retries aside (none without
# --retry-aborts). The harness's own counts are not used: under valgrind
# its clock makes the run's windows unreliable.
#
# Usage: scripts/ir-dtx.sh [tatp|smallbank] [EXTRA_ARGS...]
#   defaults: tatp --subscribers 10000 / smallbank --accounts 100000,
#   1 thread x 8 coroutines, 3 s. One transaction type alone:
#   e.g. scripts/ir-dtx.sh tatp --mix update_location=100.
# Output: total instructions, attempts, instructions per attempt; the
# callgrind file in $OUT (default results/ir-dtx) for callgrind_annotate.
# BRANCHES=1 also simulates branch prediction (callgrind --branch-sim=yes)
# and prints mispredicted branches per attempt.
set -euo pipefail
cd "$(dirname "$0")/.."
workload=${1:-tatp}
shift || true
case $workload in
  tatp) size=(--subscribers 10000) ;;
  smallbank) size=(--accounts 100000) ;;
  *) echo "usage: scripts/ir-dtx.sh [tatp|smallbank] [EXTRA_ARGS...]" >&2; exit 2 ;;
esac
for tool in valgrind callgrind_control; do
  command -v $tool >/dev/null || { echo "needs $tool (apt-get install valgrind)" >&2; exit 2; }
done
out=${OUT:-results/ir-dtx}
mkdir -p "$out"
cargo build --release --quiet --bin compute-blade
file="$out/callgrind.$workload"
rm -f "$file" "$out/stderr"
sim=()
[ "${BRANCHES:-0}" = 1 ] && sim=(--branch-sim=yes)
valgrind --tool=callgrind --fair-sched=yes --instr-atstart=no "${sim[@]}" --callgrind-out-file="$file" \
  target/release/compute-blade "$workload" "${size[@]}" --threads 1 --coroutines 8 --duration 3 \
  --warmup 0 --lease 600 "$@" >/dev/null 2>"$out/stderr" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
on=0
for _ in $(seq 3000); do
  if grep -q "loaded in" "$out/stderr" 2>/dev/null; then
    callgrind_control -i on $pid >/dev/null
    on=1
    break
  fi
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
wait $pid
trap - EXIT
[ $on = 1 ] || { echo "the run never printed its 'loaded in' line (see $out/stderr)" >&2; exit 1; }
python3 - "$file" <<'PY'
import re, sys
# Sum the call counts of every call to a function whose name holds
# "Workload>::draw", and read the total instruction count.
names, calls, target, total, events, sums = {}, 0, None, 0, [], []
for line in open(sys.argv[1]):
    if line.startswith("events:"):
        events = line.split()[1:]
    if line.startswith("summary:") or line.startswith("totals:"):
        sums = [int(x) for x in line.split()[1:]]
        total = sums[0]
    m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line)
    if m:
        if m.group(3):
            names[m.group(2)] = m.group(3)
        if m.group(1) == "cfn":
            target = names.get(m.group(2))
        continue
    if line.startswith("calls=") and target and "Workload>::draw" in target:
        calls += int(line.split("=")[1].split()[0])
if not calls:
    sys.exit("no calls of the workload's draw were counted")
print(f"instructions {total:,}  attempts {calls:,}  per attempt {total / calls:,.0f}")
ev = dict(zip(events, sums))
if "Bcm" in ev:
    # Conditional and indirect branches, and those the simulated
    # predictor missed, per attempt.
    b, m = ev["Bc"] + ev.get("Bi", 0), ev["Bcm"] + ev.get("Bim", 0)
    print(f"branches per attempt {b / calls:,.0f}  mispredicted {m / calls:,.1f} ({100 * m / max(b, 1):.2f}%)")
PY
