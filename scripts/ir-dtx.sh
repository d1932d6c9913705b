#!/usr/bin/env bash
# Instructions per attempted transaction of `compute-blade tatp` or
# `smallbank` on the embedded backend, counted by callgrind (repeatable on
# a noisy machine, where timings are not), or per READ of `compute-blade
# micro` for comparison. Counting starts once the database is loaded
# (callgrind_control turns instrumentation on at the run's "loaded in"
# line), and the total is divided by the calls of the workload's `draw`:
# one per attempt, retries aside (none without --retry-aborts). For
# `micro` (8-byte READs, one per batch) counting starts at once and the
# total is divided by the batches posted (`Post::post_now`). The
# harness's own counts are not used: under valgrind its clock makes the
# run's windows unreliable.
#
# Usage: scripts/ir-dtx.sh [tatp|smallbank|micro] [EXTRA_ARGS...]
#   defaults: tatp --subscribers 10000 / smallbank --accounts 100000 /
#   micro --op read --size 8; 1 thread x 8 coroutines, 3 s. One
#   transaction type alone: e.g. scripts/ir-dtx.sh tatp --mix
#   update_location=100.
# Output: total instructions, attempts, instructions per attempt; the
# callgrind file in $OUT (default results/ir-dtx) for callgrind_annotate.
# BRANCHES=1 also simulates branch prediction (callgrind --branch-sim=yes)
# and prints mispredicted branches per attempt.
# CACHE=1 also simulates this machine's caches (a 32 KiB 8-way L1i, a
# 48 KiB 12-way L1d, a 2 MiB 16-way L2 as the last level) and prints, per
# attempt, the L1i and L1d misses, and the hot code: the KiB of 64-byte
# lines of machine code entered at least 0.2 times per attempt on average
# (the code an attempt keeps in the instruction cache), and at least 0.05
# times.
set -euo pipefail
cd "$(dirname "$0")/.."
workload=${1:-tatp}
shift || true
# Per workload: its arguments, the function counted, and whether counting
# starts at once (on=1) or at the end of the load.
case $workload in
  tatp) args=(--subscribers 10000 --lease 600) count="Workload>::draw" on=0 ;;
  smallbank) args=(--accounts 100000 --lease 600) count="Workload>::draw" on=0 ;;
  micro) args=(--op read --size 8) count="Post::post_now" on=1 ;;
  *) echo "usage: scripts/ir-dtx.sh [tatp|smallbank|micro] [EXTRA_ARGS...]" >&2; exit 2 ;;
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
[ "${BRANCHES:-0}" = 1 ] && sim+=(--branch-sim=yes)
[ "${CACHE:-0}" = 1 ] && sim+=(--cache-sim=yes --I1=32768,8,64 --D1=49152,12,64 --LL=2097152,16,64 --dump-instr=yes)
atstart=no
[ $on = 1 ] && atstart=yes
valgrind --tool=callgrind --fair-sched=yes --instr-atstart=$atstart "${sim[@]}" --callgrind-out-file="$file" \
  target/release/compute-blade "$workload" "${args[@]}" --threads 1 --coroutines 8 --duration 3 --warmup 0 "$@" \
  >/dev/null 2>"$out/stderr" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 3000); do
  [ $on = 1 ] && break
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
python3 - "$file" "$count" <<'PY'
import collections, re, sys
# Sum the call counts of every call to the counted function (the
# workload's draw, or micro's post), and read the total instruction
# count; with --dump-instr, also the most times each 64-byte line of code
# was entered (the count of its most executed instruction).
counted, names, calls, target, total, events, sums = sys.argv[2], {}, 0, None, 0, [], []
lines, addr, call_cost = collections.Counter(), 0, False
for line in open(sys.argv[1]):
    if line.startswith("events:"):
        events = line.split()[1:]
    if line.startswith("summary:") or line.startswith("totals:"):
        sums = [int(x) for x in line.split()[1:]]
        total = sums[0]
    m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line)
    if m:
        if m.group(3):
            names[m.group(2)] = m.group(3).strip()
        if m.group(1) == "cfn":
            target = names.get(m.group(2))
        continue
    if line.startswith("calls="):
        if target and counted in target:
            calls += int(line.split("=")[1].split()[0])
        call_cost = True  # the next cost line is the call's inclusive cost
        continue
    if not line or line[0] not in "0123456789+-*":
        continue
    f = line.split()
    a = f[0]
    if a.startswith("0x"):
        addr = int(a, 16)
    elif a[0] in "+-":
        d = int(a[1:], 16) if a[1:].startswith("0x") else int(a[1:])
        addr += d if a[0] == "+" else -d
    elif a != "*":
        addr = int(a)
    if call_cost:
        call_cost = False
        continue
    if len(f) >= 3:
        lines[addr >> 6] = max(lines[addr >> 6], int(f[2]))
if not calls:
    sys.exit(f"no calls of {counted} were counted")
print(f"instructions {total:,}  attempts {calls:,}  per attempt {total / calls:,.0f}")
ev = dict(zip(events, sums))
if "Bcm" in ev:
    # Conditional and indirect branches, and those the simulated
    # predictor missed, per attempt.
    b, m = ev["Bc"] + ev.get("Bi", 0), ev["Bcm"] + ev.get("Bim", 0)
    print(f"branches per attempt {b / calls:,.0f}  mispredicted {m / calls:,.1f} ({100 * m / max(b, 1):.2f}%)")
if "I1mr" in ev:
    hot = lambda at_least: sum(1 for n in lines.values() if n / calls >= at_least) * 64 / 1024
    print(f"L1i misses per attempt {ev['I1mr'] / calls:,.1f}  L1d misses {(ev['D1mr'] + ev['D1mw']) / calls:,.1f}  "
          f"hot code {hot(0.2):.1f} KiB (lines entered >= 0.2 times per attempt), {hot(0.05):.1f} KiB (>= 0.05)")
PY
