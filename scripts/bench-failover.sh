#!/usr/bin/env bash
# Throughput through a memory blade's failure, with a coordinator: etcd and
# three memory-blade processes on loopback, k = 2 replicas, two compute
# blades (1 thread x 8 coroutines each, request time-out and lease 2 s) run
# SmallBank, then TATP, for SECONDS; KILL_AT seconds into their measured
# time memory blade BLADE is SIGKILLed. The compute blades fail over (the
# blade taken out of the configuration in etcd, the earlier epoch fenced and
# settled, a backup promoted where the primary was lost) and go on. Then a
# fresh blade is rebuilt in its place and the database audited. With
# REJOIN_AT, the fresh blade is started REJOIN_AT seconds into the run and
# rebuilt online (`compute-blade rebuild --online`, at COPY_RATE MB/s,
# default 2, and with SHARE set, e.g. 0.8, `--foreground-share SHARE`: the
# copy paced to keep the compute blades at that share of their throughput
# before it) while both compute blades run on, and the database audited
# once they end. WORKLOADS (default "smallbank tatp") picks the workloads.
#
#   scripts/bench-failover.sh [SECONDS] [KILL_AT] [BLADE] [REJOIN_AT]
#
# Defaults: 12 s, 4 s, blade 1 (blade 0 fails over too, its databases'
# mirrors on blade 1 standing for its catalog and registry, and is rebuilt
# online as any other with REJOIN_AT). Prints, per workload, committed transactions per second in
# 1 s windows (both compute blades together), the time from the kill to
# the next commits, and throughput before and after; writes the records,
# $OUT/failover.md (the table), $OUT/failover.csv (the windows) and, if
# the plots' venv is there (scripts/figure makes it), $OUT/failover.png.
# Needs etcd (Debian's etcd-server).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-12}
kill_at=${2:-4}
lost=${3:-1}
rejoin_at=${4:-}
copy_rate=${COPY_RATE:-2}
share=${SHARE:-}
workloads=${WORKLOADS:-smallbank tatp}
share_args=()
if [ -n "$share" ]; then
  share_args=(--foreground-share "$share")
fi
out=${OUT:-results/failover}
. scripts/lib.sh
need_seconds SECONDS "$secs"
need_seconds KILL_AT "$kill_at"
if ! [[ $lost =~ ^[0-2]$ ]]; then
  echo "$(basename "$0"): BLADE must be 0, 1 or 2, not \"$lost\"" >&2
  exit 2
fi
if ! awk -v k="$kill_at" -v s="$secs" 'BEGIN { exit !(k + 2 < s) }'; then
  echo "$(basename "$0"): KILL_AT must leave at least 2 s of SECONDS after it" >&2
  exit 2
fi
if [ -n "$rejoin_at" ]; then
  need_seconds REJOIN_AT "$rejoin_at"
  if ! awk -v k="$kill_at" -v r="$rejoin_at" -v s="$secs" 'BEGIN { exit !(k + 1 < r && r + 2 < s) }'; then
    echo "$(basename "$0"): REJOIN_AT must be at least 1 s after KILL_AT and 2 s before SECONDS" >&2
    exit 2
  fi
fi
command -v etcd >/dev/null || { echo "$(basename "$0"): needs etcd (apt-get install etcd-server)" >&2; exit 2; }
prepare "$out"
rm -f "$out"/*.json "$out"/*.err
ETCD_PID=
RUN_PIDS=()
cleanup() {
  local p
  for p in "${RUN_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  kill_blades
  if [ -n "$ETCD_PID" ]; then
    kill -KILL "$ETCD_PID" 2>/dev/null || true
    wait "$ETCD_PID" 2>/dev/null || true
  fi
  rm -rf "$out/etcd"
}
trap cleanup EXIT
cport=$(free_port)
pport=$(free_port)
etcd --name bench --data-dir "$out/etcd" \
  --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
  --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
  --initial-cluster "bench=http://127.0.0.1:$pport" >"$out/etcd.log" 2>&1 &
ETCD_PID=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$cport/health" >/dev/null 2>&1 && break
  sleep 0.1
done
for w in $workloads; do
  start_blades 3 "$out" --size 512MiB
  coord="http://127.0.0.1:$cport/bench-$w"
  size=(--accounts 20000)
  [ "$w" = tatp ] && size=(--subscribers 20000)
  base=("$w" "${size[@]}" --blades "$BLADES" --coordinator "$coord" --lease 2 --request-timeout 2)
  echo "$w: loading" >&2
  "$bin/compute-blade" "${base[@]}" --duration 0.3 --warmup 0 --quiet >/dev/null
  run=(--threads 1 --coroutines 8 --duration "$secs" --warmup 0 --retry-aborts)
  RUN_PIDS=()
  for c in a b; do
    "$bin/compute-blade" "${base[@]}" "${run[@]}" --json "$out/$w-$c.json" >/dev/null 2>"$out/$w-$c.err" &
    RUN_PIDS+=($!)
  done
  # Both registered, then KILL_AT seconds.
  for _ in $(seq 300); do
    [ "$(cat "$out/$w-a.err" "$out/$w-b.err" | grep -c '^registered as compute blade')" -ge 2 ] && break
    sleep 0.05
  done
  t0=$(date +%s.%N)
  sleep "$kill_at"
  echo "$w: SIGKILL of memory blade $lost" >&2
  kill -KILL "${BLADE_PIDS[$lost]}"
  wait "${BLADE_PIDS[$lost]}" 2>/dev/null || true
  fresh() {
    launch_blade "$out/fresh.out" --size 512MiB
    IFS=, read -r -a addrs <<<"$BLADES"
    addrs[$lost]=$LAUNCHED_ADDR
    BLADE_PIDS[$lost]=$LAUNCHED_PID
    BLADES=$(IFS=,; echo "${addrs[*]}")
  }
  since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
  if [ -n "$rejoin_at" ]; then
    # A fresh blade in its place, rebuilt while the compute blades run.
    sleep "$(awk -v a="$t0" -v r="$rejoin_at" -v b="$(date +%s.%N)" 'BEGIN { d = a + r - b; print (d > 0 ? d : 0) }')"
    fresh
    copy_from=$(since "$t0")
    echo "$w: rebuild --online of memory blade $lost at $copy_from s" >&2
    "$bin/compute-blade" rebuild --lost "$lost" --online --copy-rate "$copy_rate" ${share_args[@]+"${share_args[@]}"} \
      --lease 2 --request-timeout 2 --blades "$BLADES" --coordinator "$coord" --json "$out/$w-rebuild.json" >"$out/$w-rebuild.out" 2>&1
    copy_to=$(since "$t0")
    echo "$w: taken in at $copy_to s" >&2
    echo "$copy_from $copy_to" >"$out/$w-copy.times"
    for p in "${RUN_PIDS[@]}"; do wait "$p" || echo "$w: a compute blade exited $?" >&2; done
    RUN_PIDS=()
  else
    for p in "${RUN_PIDS[@]}"; do wait "$p" || echo "$w: a compute blade exited $?" >&2; done
    RUN_PIDS=()
    # A fresh blade in its place, rebuilt, the database audited.
    fresh
    sleep 4.5 # the compute blades' leases and recovery's grace
    started=$(date +%s.%N)
    "$bin/compute-blade" rebuild --lost "$lost" --blades "$BLADES" --coordinator "$coord" >"$out/$w-rebuild.out" 2>&1
    echo "$w: rebuilt in $(since "$started") s" >&2
    rm -f "$out/$w-copy.times"
  fi
  "$bin/compute-blade" "$w" "${size[@]}" --blades "$BLADES" --coordinator "$coord" --audit-only --quiet \
    --json "$out/$w-audit.json" >/dev/null
  stop_blades
done
python3 - "$out" "$secs" "$kill_at" "$lost" <<'PY' | tee "$out/failover.md"
import csv, json, os, sys
out, secs, kill_at, lost = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
rows = []
print(f"Memory blade {lost} SIGKILLed {kill_at:g} s into a {secs:g} s run of two compute blades "
      "(1 thread x 8 coroutines each, k = 2, three TCP blades on loopback, request time-out and lease 2 s).\n")
online = os.path.exists(os.path.join(out, "smallbank-copy.times"))
if online:
    print("| workload | committed txn/s before | after the failover | during the online copy | after taking it in "
          "| resumed after (s) | copy (s) | audit at the end |")
    print("|---|---|---|---|---|---|---|---|")
else:
    print("| workload | committed txn/s before | after | resumed after (s) | window of the kill | audit after the rebuild |")
    print("|---|---|---|---|---|---|")
windows = {}
for w in [w for w in ("smallbank", "tatp") if os.path.exists(os.path.join(out, f"{w}-a.json"))]:
    recs = [json.load(open(os.path.join(out, f"{w}-{c}.json"))) for c in "ab"]
    audit = json.load(open(os.path.join(out, f"{w}-audit.json")))
    # Committed transactions per 1 s window, both compute blades. Each
    # timeline sample is Mtxn/s over the second ending at t_s, or over less
    # (a phase's last sample ends where the phase did, and the next phase's
    # first covers the second before it): its transactions are spread over
    # the windows its interval overlaps.
    per = {}
    for r in recs:
        prev = 0.0
        for s in r["timeline"]:
            t = s["t_s"]
            start = max(prev, t - 1.0)
            txns = s["mops"] * 1e6 * (t - start)
            k = int(start)
            while k < t:
                part = min(t, k + 1) - max(start, k)
                if part > 0 and t > start:
                    per[k] = per.get(k, 0.0) + txns * part / (t - start)
                k += 1
            prev = t
    windows[w] = per
    fo = [r["failovers"][0] for r in recs if r.get("failovers")]
    at = min(f["at_s"] for f in fo) if fo else None
    back = max(f["at_s"] + f.get("resumed_after_s", 0) for f in fo) if fo else None
    before = [v for k, v in per.items() if at is not None and k + 1 <= at]
    after = [v for k, v in per.items() if back is not None and k >= back + 1]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    kill_w = per.get(int(at), float("nan")) if at is not None else float("nan")
    gap = max(f.get("resumed_after_s", 0) for f in fo) if fo else float("nan")
    if online:
        c0, c1 = map(float, open(os.path.join(out, f"{w}-copy.times")).read().split())
        # Windows wholly inside each phase (the runs' clocks start about
        # when both registered; the script's at its first sleep).
        degraded = [v for k, v in per.items() if k >= back + 1 and k + 1 <= c0]
        during = [v for k, v in per.items() if k >= c0 and k + 1 <= c1]
        taken = [v for k, v in per.items() if k >= c1 + 1 and k + 1 <= secs]
        print(f"| {w} | {mean(before):,.0f} | {mean(degraded):,.0f} | {mean(during):,.0f} | {mean(taken):,.0f} "
              f"| {gap:.2f} | {c1 - c0:.1f} | {audit['violations']} violations |")
    else:
        print(f"| {w} | {mean(before):,.0f} | {mean(after):,.0f} | {gap:.2f} | {kill_w:,.0f} | "
              f"{audit['violations']} violations |")
with open(os.path.join(out, "failover.csv"), "w", newline="") as f:
    wr = csv.writer(f)
    wr.writerow(["workload", "second", "committed_per_s"])
    for w, per in windows.items():
        for k in sorted(per):
            wr.writerow([w, k, round(per[k])])
print()
for w, per in windows.items():
    top = max(per.values()) or 1
    print(f"{w} (committed txn/s per second):")
    for k in sorted(per):
        print(f"  {k:>3}s {per[k]:>10,.0f} {'#' * int(40 * per[k] / top)}")
PY
venv=${SMART_RS_VENV:-.venv}
if [ -x "$venv/bin/python" ]; then
  "$venv/bin/python" - "$out" "$lost" <<'PY'
import csv, os, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out, lost = sys.argv[1], sys.argv[2]
data = {}
for r in csv.DictReader(open(os.path.join(out, "failover.csv"))):
    data.setdefault(r["workload"], []).append((int(r["second"]), float(r["committed_per_s"])))
fig, ax = plt.subplots(figsize=(6, 3))
for w, pts in data.items():
    xs, ys = zip(*sorted(pts))
    ax.step(xs, [y / 1e3 for y in ys], where="post", label=w)
ax.set_xlabel("second of the run")
ax.set_ylabel("committed (K txn/s)")
copies = [os.path.join(out, f"{w}-copy.times") for w in data]
for f in copies:
    if os.path.exists(f):
        c0, c1 = map(float, open(f).read().split())
        ax.axvspan(c0, c1, alpha=0.1, color="grey")
online = any(os.path.exists(f) for f in copies)
ax.set_title(f"memory blade {lost} SIGKILLed, failover" + (", online re-replication (grey)" if online else ", backups promoted"))
ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(out, "failover.png"), dpi=120)
PY
fi
