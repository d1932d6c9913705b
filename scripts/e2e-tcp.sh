#!/usr/bin/env bash
# End-to-end over loopback TCP: a memory-blade process, compute-blade runs of
# every verb against it, the result records checked, the blade stopped with
# SIGTERM. Usage: scripts/e2e-tcp.sh [path/to/target/release]
set -euo pipefail
bin=${1:-target/release}
work=$(mktemp -d)
blade_pid=
cleanup() {
  if [ -n "$blade_pid" ] && kill -0 "$blade_pid" 2>/dev/null; then kill -KILL "$blade_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

"$bin/memory-blade" --listen 127.0.0.1:0 --size 128MiB --backing-file "$work/blade.img" >"$work/blade.out" &
blade_pid=$!
for _ in $(seq 100); do grep -q '^ready ' "$work/blade.out" 2>/dev/null && break; sleep 0.1; done
addr=$(awk '/^ready /{print $2}' "$work/blade.out")
[ -n "$addr" ] || { echo "e2e: memory-blade never printed its ready line" >&2; exit 1; }
echo "e2e: memory-blade ready at $addr"

run() {
  local name=$1; shift
  timeout 60 "$bin/compute-blade" micro --blades "$addr" --duration 1 --warmup 0.2 --quiet --json "$work/$name.json" "$@"
  python3 - "$work/$name.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
name = sys.argv[2]
assert r["transport"] == "tcp", r
assert r["ops"] > 0 and r["throughput_mops"] > 0, f"{name}: no operations: {r}"
assert r["errors"] == 0 and r["violations"] == 0, f"{name}: errors or violations: {r}"
print(f"e2e: {name}: {r['throughput_mops']:.3f} Mop/s, p50 {r['latency_us']['p50']:.1f} us, ok")
PY
}
run read --op read --size 64 --threads 2 --coroutines 8
run write --op write --size 256 --batch 4
run faa-contended --op faa --contended --threads 2 --coroutines 4
run cas-contended --op cas --contended --threads 2 --coroutines 4
run smart-none --op faa --contended --threads 2 --coroutines 4 --smart none

# YCSB over the RACE hash table on the blade, every value checked, on a
# table created for 1000 keys that the load grows.
timeout 120 "$bin/compute-blade" ycsb --blades "$addr" --app race --workload a --keys 20000 --capacity 1000 --verify \
  --threads 2 --coroutines 8 --duration 1 --warmup 0.2 --quiet --json "$work/ycsb.json"
python3 - "$work/ycsb.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ops"] > 0 and r["errors"] == 0 and r["violations"] == 0 and r["duplicates"] == 0, r
assert r["race"]["splits"] > 0, r
print(f"e2e: ycsb a over race-ht: {r['throughput_mops']:.3f} Mop/s, verified, "
      f"grew to {r['race']['subtables']} subtables, ok")
PY

# YCSB e over the Sherman B+tree: scans checked against every key known
# present, the tree grown from one leaf.
timeout 120 "$bin/compute-blade" ycsb --blades "$addr" --app sherman --workload e --keys 20000 --verify \
  --threads 2 --coroutines 8 --duration 1 --warmup 0.2 --smart all --quiet --json "$work/btree.json"
python3 - "$work/btree.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ops"] > 0 and r["errors"] == 0 and r["violations"] == 0 and r["duplicates"] == 0, r
t = r["sherman"]
assert t["depth"] >= 3 and t["keys"] >= 20000, t
print(f"e2e: ycsb e over sherman-bt: {r['throughput_mops']:.3f} Mop/s, scans verified, "
      f"depth {t['depth']}, {t['keys']} keys, ok")
PY

# SmallBank and TATP (FORD transactions, one replica on this one blade),
# audited: money conserved, no lock held; then recover finds nothing dead.
timeout 120 "$bin/compute-blade" smallbank --blades "$addr" --replicas 1 --accounts 5000 --hot 200 --audit \
  --threads 2 --coroutines 8 --duration 1 --warmup 0.2 --quiet --json "$work/smallbank.json"
timeout 120 "$bin/compute-blade" tatp --blades "$addr" --replicas 1 --subscribers 5000 --audit \
  --threads 2 --coroutines 8 --duration 1 --warmup 0.2 --quiet --json "$work/tatp.json"
python3 - "$work/smallbank.json" "$work/tatp.json" <<'PY'
import json, sys
for path in sys.argv[1:]:
    r = json.load(open(path))
    assert r["committed"] > 0 and r["errors"] == 0 and r["violations"] == 0, r
    assert r["audit"]["db"]["locks_held"] == 0, r
    print(f"e2e: {r['bench']}: {r['committed_per_s']:.0f} committed txn/s, abort rate {r['abort_rate']:.3f}, "
          f"{r['verbs_per_attempted']:.2f} verbs/attempted, audited, ok")
PY
recovered=$(timeout 60 "$bin/compute-blade" recover --blades "$addr")
grep -q "smallbank: no dead compute blade" <<<"$recovered" || { echo "e2e: recover: $recovered" >&2; exit 1; }
echo "e2e: recover: nothing dead, ok"

kill -TERM "$blade_pid"
for _ in $(seq 100); do kill -0 "$blade_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$blade_pid" 2>/dev/null; then echo "e2e: memory-blade ignored SIGTERM" >&2; exit 1; fi
wait "$blade_pid" || { echo "e2e: memory-blade exited non-zero" >&2; exit 1; }
blade_pid=
echo "e2e: memory-blade stopped cleanly"

# A durable blade (--durable: no write answered before its disk holds it):
# audited SmallBank on it, then a clean stop. The power loss itself is
# tested by dtx::a_durable_blade_loses_no_committed_transaction_when_the_power_fails
# (root: it loop-mounts a file system).
"$bin/memory-blade" --listen 127.0.0.1:0 --size 64MiB --backing-file "$work/durable.img" --durable \
  >"$work/durable.out" 2>"$work/durable.err" &
blade_pid=$!
for _ in $(seq 100); do grep -q '^ready ' "$work/durable.out" 2>/dev/null && break; sleep 0.1; done
addr=$(awk '/^ready /{print $2}' "$work/durable.out")
[ -n "$addr" ] || { echo "e2e: the durable memory-blade never printed its ready line" >&2; cat "$work/durable.err" >&2; exit 1; }
grep -q "durable (writes on disk before they complete)" "$work/durable.err" ||
  { echo "e2e: the durable blade did not say so" >&2; cat "$work/durable.err" >&2; exit 1; }
timeout 120 "$bin/compute-blade" smallbank --blades "$addr" --replicas 1 --accounts 2000 --hot 100 --audit \
  --threads 2 --coroutines 8 --duration 1 --warmup 0.2 --quiet --json "$work/durable.json"
python3 - "$work/durable.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["committed"] > 0 and r["errors"] == 0 and r["violations"] == 0, r
print(f"e2e: smallbank on a --durable blade: {r['committed_per_s']:.0f} committed txn/s, audited, ok")
PY
kill -TERM "$blade_pid"
for _ in $(seq 100); do kill -0 "$blade_pid" 2>/dev/null || break; sleep 0.1; done
wait "$blade_pid" || { echo "e2e: the durable memory-blade exited non-zero" >&2; exit 1; }
blade_pid=
echo "e2e: durable memory-blade stopped cleanly"
