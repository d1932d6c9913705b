#!/usr/bin/env bash
# SmallBank or TATP one transaction type at a time (`--mix TYPE=100`), on
# the embedded backend, against `compute-blade micro` (8-byte READs) at the
# same threads and coroutines: which types keep the framework busy for
# their verbs. Per type: attempted and committed txn/s, verbs and doorbells
# per attempt, and the type's verbs/s over micro's. Each round runs micro
# and then every type (and the whole mix) once; a cell is the median over
# ROUNDS, the ratio the median of the per-round ratios.
#
#   scripts/bench-dtx-types.sh [tatp|smallbank] [SECONDS] [ROUNDS] [THREADS] [COROUTINES]
#
# Defaults: tatp, 3 s, 1 round, 1 thread x 8 coroutines. With IR=1 the
# instructions per attempt of each type are counted too (scripts/ir-dtx.sh,
# about a minute per type under callgrind). Records go to $OUT (default
# results/dtx-types); the table is printed and written to $OUT/types.md.
set -euo pipefail
cd "$(dirname "$0")/.."
workload=${1:-tatp}
secs=${2:-3}
rounds=${3:-1}
threads=${4:-1}
coroutines=${5:-8}
case $workload in
  tatp) types=(get_subscriber_data get_new_destination get_access_data update_subscriber_data update_location
    insert_call_forwarding delete_call_forwarding) ;;
  smallbank) types=(amalgamate balance deposit_checking send_payment transact_savings write_check) ;;
  *) echo "usage: scripts/bench-dtx-types.sh [tatp|smallbank] [SECONDS] [ROUNDS] [THREADS] [COROUTINES]" >&2; exit 2 ;;
esac
out=${OUT:-results/dtx-types}
. scripts/lib.sh
need_seconds SECONDS "$secs"
need_count ROUNDS "$rounds"
need_count THREADS "$threads"
need_count COROUTINES "$coroutines"
prepare "$out"
rm -f "$out"/*.json "$out"/ir.txt
common=(--threads "$threads" --coroutines "$coroutines" --duration "$secs" --warmup 1 --quiet)
for r in $(seq "$rounds"); do
  echo "round $r: micro" >&2
  "$bin/compute-blade" micro --op read --size 8 "${common[@]}" --json "$out/micro-$r.json" >/dev/null
  for t in mix "${types[@]}"; do
    mix=()
    [ "$t" != mix ] && mix=(--mix "$t=100")
    echo "round $r: $workload $t" >&2
    "$bin/compute-blade" "$workload" "${mix[@]}" "${common[@]}" --json "$out/$t-$r.json" >/dev/null
  done
done
if [ "${IR:-0}" = 1 ]; then
  for t in mix "${types[@]}"; do
    mix=()
    [ "$t" != mix ] && mix=(--mix "$t=100")
    echo "instructions: $workload $t" >&2
    n=$(OUT="$out/ir" scripts/ir-dtx.sh "$workload" "${mix[@]}" | awk '/^instructions /{print $NF}' | tr -d ,)
    echo "$t $n" >>"$out/ir.txt"
  done
fi
python3 - "$out" "$rounds" "$threads" "$coroutines" mix "${types[@]}" <<'PY' | tee "$out/types.md"
import json, os, statistics, sys
out, rounds, threads, coroutines, types = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
med = statistics.median
load = lambda name, r: json.load(open(os.path.join(out, f"{name}-{r}.json")))
vps = lambda rec: rec["verbs"]["wrs"] / rec["duration_s"]
micro = [vps(load("micro", r)) for r in range(1, rounds + 1)]
ir = {}
if os.path.exists(os.path.join(out, "ir.txt")):
    ir = dict(l.split() for l in open(os.path.join(out, "ir.txt")) if l.strip())
print(f"micro READ 8 B, embedded, {threads} x {coroutines}: {med(micro) / 1e6:.2f} M verbs/s "
      f"({', '.join(f'{m / 1e6:.2f}' for m in micro)} by round); medians of {rounds} rounds\n")
head = "| type | share | attempted txn/s | committed txn/s | verbs per attempt | doorbells per attempt | verbs/s vs micro |"
if ir:
    head += " instructions per attempt |"
print(head)
print("|---" * (head.count("|") - 1) + "|")
for t in types:
    recs = [load(t, r) for r in range(1, rounds + 1)]
    share = "all" if t == "mix" else f"{load('mix', 1)['mix'][t]}%"
    row = [t if t != "mix" else "the mix", share,
           f"{med(x['attempted_per_s'] for x in recs):,.0f}",
           f"{med(x['committed_per_s'] for x in recs):,.0f}",
           f"{med(x['verbs_per_attempted'] for x in recs):.2f}",
           f"{med(x['verbs']['doorbells'] / max(x['attempted'], 1) for x in recs):.2f}",
           f"{med(vps(x) / m for x, m in zip(recs, micro)):.2f}"]
    if ir:
        row.append(f"{int(ir[t]):,}" if t in ir else "-")
    print("| " + " | ".join(row) + " |")
PY
