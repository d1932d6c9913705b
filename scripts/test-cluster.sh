#!/usr/bin/env bash
# The launcher for real, started over ssh or by srun, on this machine:
#  - ssh: a real sshd on 127.0.0.1 (Debian's openssh-server, a throw-away
#    host key and client key, this user);
#  - srun: a one-node Slurm cluster (Debian's slurm-wlm: slurmctld and slurmd
#    with their own munged, configuration and state in a scratch directory;
#    needs root). Steps are bound to their CPUs, as on clusters. First an
#    allocation of one CPU, in which preflight and run must refuse compute
#    blades of 2 threads before starting anything; then a whole node.
# Then, either way:
#  1. `scripts/cluster preflight`;
#  2. two memory blades and two compute blades, all started remotely, with a
#     barrier; the merged record's ops equal the sum of the parts' and its
#     p99 equals the p99 of the parts' histograms merged (recomputed here,
#     independently of compute-blade merge);
#  3. a compute blade SIGKILLed mid-run: the launcher stops everything it
#     started and exits non-zero, and no process of the run is left;
#  4. SIGINT (Ctrl-C) to the launcher mid-run: the same, with status 130.
# Then the launcher's unit tests (cluster files, the command lines).
#
#   scripts/test-cluster.sh [--launch ssh|srun] [path/to/target/release]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh # free_port
launch=ssh
if [ "${1:-}" = --launch ]; then
  launch=${2:-}
  shift 2 || true
fi
case $launch in
  ssh) [ -x /usr/sbin/sshd ] || { echo "test-cluster: needs openssh-server (/usr/sbin/sshd)" >&2; exit 1; } ;;
  srun)
    for b in slurmctld slurmd munged; do
      [ -x /usr/sbin/$b ] || { echo "test-cluster: needs slurm-wlm and munge (/usr/sbin/$b)" >&2; exit 1; }
    done
    [ "$(id -u)" = 0 ] || { echo "test-cluster: --launch srun runs slurmd, which needs root" >&2; exit 1; } ;;
  *) echo "test-cluster: --launch ssh or srun, not '$launch'" >&2; exit 2 ;;
esac
bin=${1:-target/release}
work=$(mktemp -d /tmp/smart-rs-cluster-test.XXXXXX)
daemons=()
run_pid=
cleanup() {
  [ -n "$run_pid" ] && kill -KILL "$run_pid" 2>/dev/null || true
  [ -n "${SLURM_JOB_ID:-}" ] && scancel "$SLURM_JOB_ID" 2>/dev/null || true
  local d
  for d in "${daemons[@]}"; do kill -TERM "$d" 2>/dev/null || true; done
  for d in "${daemons[@]}"; do
    for _ in $(seq 50); do kill -0 "$d" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$d" 2>/dev/null || true
  done
  # Anything of this test's run still alive is a failure of the launcher,
  # reported above; it is ended here, with the ssh connection master that
  # ControlPersist keeps for a minute.
  pkill -KILL -f "memory-blade --listen 127.0.0.1:(${p1:-x}|${p2:-x})|smart-rs-[0-9]+-run-|$work/" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# Every blade and compute blade of the test proves this secret (a blade
# without it would serve anyone; one with another refuses).
"$bin/compute-blade" secret "$work/cluster.secret" >/dev/null

p1=$(free_port)
p2=$(free_port)

# blades_and_computes HOST THREADS: the cluster file's processes, all on
# HOST, the memory blades listening on 127.0.0.1.
blades_and_computes() {
  cat <<EOF

[[memory_blade]]
host = "$1"
listen = "127.0.0.1"
port = $p1
size = "128MiB"

[[memory_blade]]
host = "$1"
listen = "127.0.0.1"
port = $p2
size = "128MiB"

[[compute_blade]]
host = "$1"
threads = $2

[[compute_blade]]
host = "$1"
threads = $2
EOF
}

start_sshd() {
  ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
  ssh-keygen -q -t ed25519 -N '' -f "$work/client_key"
  cp "$work/client_key.pub" "$work/authorized_keys"
  chmod 600 "$work/authorized_keys"
  local port
  port=$(free_port)
  mkdir -p /run/sshd
  cat >"$work/sshd_config" <<EOF
ListenAddress 127.0.0.1
Port $port
HostKey $work/host_key
AuthorizedKeysFile $work/authorized_keys
PidFile $work/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
EOF
  /usr/sbin/sshd -D -e -f "$work/sshd_config" 2>"$work/sshd.log" &
  daemons+=($!)
  local opts=(-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -i "$work/client_key")
  for _ in $(seq 100); do
    ssh -p "$port" "${opts[@]}" -o BatchMode=yes 127.0.0.1 true 2>/dev/null && break
    kill -0 "${daemons[0]}" 2>/dev/null || { cat "$work/sshd.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "test-cluster: sshd on 127.0.0.1:$port (pid ${daemons[0]})"
  {
    cat <<EOF
# Every process over ssh to 127.0.0.1 (this test's sshd).
[defaults]
transport = "tcp"
launch = "ssh"
ssh_port = $port
ssh_options = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-i", "$work/client_key"]
workdir = "$PWD"
bin = "$bin"
secret_file = "$work/cluster.secret"
EOF
    blades_and_computes 127.0.0.1 1
  } >"$work/cluster.toml"
}

# slurm_cluster FILE THREADS: a cluster file of processes that srun starts on
# this node.
slurm_cluster() {
  {
    cat <<EOF
# Every process started by srun on this one-node Slurm cluster.
[defaults]
transport = "tcp"
launch = "srun"
workdir = "$PWD"
bin = "$bin"
secret_file = "$work/cluster.secret"
EOF
    blades_and_computes "$node" "$2"
  } >"$1"
}

start_slurm() {
  node=$(hostname -s)
  # Compute blades reach the memory blades by the node's name: it must be
  # this machine's loopback (tests send nothing off it).
  case $(getent hosts "$node" | awk '{print $1; exit}') in
    127.* | ::1) ;;
    *) echo "test-cluster: $node does not resolve to a loopback address; --launch srun needs it to" >&2; exit 1 ;;
  esac
  mungekey --create --keyfile="$work/munge.key" >/dev/null 2>&1 ||
    { dd if=/dev/urandom of="$work/munge.key" bs=1024 count=1 2>/dev/null && chmod 400 "$work/munge.key"; }
  /usr/sbin/munged -F -f -S "$work/munge.sock" --key-file="$work/munge.key" --pid-file="$work/munged.pid" \
    --seed-file="$work/munge.seed" --log-file="$work/munged.log" 2>"$work/munged.err" &
  daemons+=($!)
  mkdir -p "$work/slurm-state" "$work/slurmd-spool"
  cat >"$work/slurm.conf" <<EOF
ClusterName=smartrs-test
SlurmctldHost=$node
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge.sock
StateSaveLocation=$work/slurm-state
SlurmdSpoolDir=$work/slurmd-spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
NodeName=$node CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$work/slurm.conf
  for _ in $(seq 50); do [ -S "$work/munge.sock" ] && break; sleep 0.1; done
  /usr/sbin/slurmctld -D -f "$SLURM_CONF" 2>"$work/slurmctld.err" &
  daemons+=($!)
  /usr/sbin/slurmd -D -f "$SLURM_CONF" 2>"$work/slurmd.err" &
  daemons+=($!)
  for _ in $(seq 150); do
    sinfo -h -n "$node" -o %t 2>/dev/null | grep -q idle && break
    sleep 0.2
  done
  sinfo -h -n "$node" -o %t 2>/dev/null | grep -q idle || {
    echo "test-cluster: the Slurm node never came up" >&2
    tail -n 5 "$work"/slurmctld.log "$work"/slurmd.log "$work"/*.err >&2 || true
    exit 1
  }
  echo "test-cluster: Slurm on $node ($(nproc) CPUs): munged, slurmctld and slurmd (pids ${daemons[*]})"
}

# allocate ARGS...: a new Slurm allocation (sets SLURM_JOB_ID, which the
# launcher's srun steps run in), the last one released.
allocate() {
  [ -n "${SLURM_JOB_ID:-}" ] && scancel "$SLURM_JOB_ID"
  SLURM_JOB_ID=$(salloc --no-shell -N1 "$@" 2>&1 | sed -n 's/.*Granted job allocation \([0-9]*\).*/\1/p')
  [ -n "$SLURM_JOB_ID" ] || { echo "test-cluster: salloc $* failed" >&2; exit 1; }
  export SLURM_JOB_ID
}

export SMART_RS_NO_BUILD=1 SMART_RS_SSH_CONTROL_DIR=$work
if [ "$launch" = ssh ]; then
  start_sshd
else
  start_slurm
  echo "== an allocation of one CPU (salloc -n1): compute blades of 2 threads are refused"
  allocate -n1
  slurm_cluster "$work/two-threads.toml" 2
  status=0
  scripts/cluster preflight --cluster "$work/two-threads.toml" 2>"$work/one-cpu.err" || status=$?
  cat "$work/one-cpu.err"
  { [ "$status" = 1 ] && grep -q "gets 1 CPU (nproc)" "$work/one-cpu.err"; } ||
    { echo "test-cluster: preflight in a one-CPU allocation exited $status without naming the CPUs" >&2; exit 1; }
  status=0
  scripts/cluster run --cluster "$work/two-threads.toml" --out "$work/one-cpu" -- \
    ycsb --workload c --keys 5000 --threads 2 --duration 1 2>"$work/one-cpu.err" || status=$?
  { [ "$status" = 1 ] && grep -q "salloc --exclusive" "$work/one-cpu.err"; } ||
    { cat "$work/one-cpu.err" >&2; echo "test-cluster: a run in a one-CPU allocation was not refused" >&2; exit 1; }
  if ls "$work"/one-cpu/logs/*memory-blade* >/dev/null 2>&1; then
    echo "test-cluster: the refused run started memory blades" >&2
    exit 1
  fi
  echo "test-cluster: preflight and run refused in a one-CPU allocation, before starting anything"
  allocate --exclusive
  echo "test-cluster: allocation $SLURM_JOB_ID (salloc --exclusive): $(srun --overlap -N1 -n1 nproc) CPUs per step"
  slurm_cluster "$work/cluster.toml" 1
fi

echo "== preflight ($launch)"
scripts/cluster preflight --cluster "$work/cluster.toml"

echo "== two memory blades and two compute blades ($launch), with a barrier"
scripts/cluster run --cluster "$work/cluster.toml" --processes 2 --out "$work/run" -- \
  ycsb --workload c --keys 5000 --threads 1 --coroutines 4 --duration 1 --warmup 0.2
# The merged p99 is checked with Python's HdrHistogram library (the venv
# of scripts/figure, pinned in scripts/smartrs/requirements.txt).
venv=${SMART_RS_VENV:-.venv}
if [ ! -x "$venv/bin/python" ] || ! cmp -s scripts/smartrs/requirements.txt "$venv/.requirements"; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/smartrs/requirements.txt
  cp scripts/smartrs/requirements.txt "$venv/.requirements"
fi
"$venv/bin/python" - "$work/run" "$work/cluster.toml" <<'PY'
import hashlib, json, sys
from pathlib import Path
from hdrh.histogram import HdrHistogram
d = Path(sys.argv[1])
m = json.loads((d / "merged.json").read_text())
parts = [json.loads((d / "logs" / f"run-p{i}.json").read_text()) for i in (1, 2)]
assert m["processes"] == 2 and m["blades"] == 2, m
assert m["ops"] == sum(p["ops"] for p in parts) > 0, (m["ops"], [p["ops"] for p in parts])
sha = hashlib.sha256(Path(sys.argv[2]).read_bytes()).hexdigest()
for p in parts:
    assert p["provenance"]["cluster_file_sha256"] == sha, p["provenance"]
    assert "--barrier" in p["provenance"]["command"], p["provenance"]["command"]
# The p99 of the merged histograms, recomputed from the parts' HdrHistograms
# (capped at the exact maximum, as the record documents it).
# (A decoded histogram tracks only up to its own largest value: the parts
# are added into one that tracks an hour.)
merged, mx = HdrHistogram(1, 3_600_000_000_000, 3), 0
for p in parts:
    h = p["latency_hist"]
    assert h["unit"] == "ns" and h["encoding"] == "hdrhistogram-v2-compressed-base64", h["encoding"]
    merged.add(HdrHistogram.decode(h["hdr"]))
    mx = max(mx, h["max"])
p99 = min(merged.get_value_at_percentile(99.0), mx) / 1000
# The two libraries round the rank at a percentile differently (Rust's
# hdrhistogram and Python's hdrh gave 1277.951 and 1275.903 us for one
# merged histogram: neighbouring values of it), so the record's p99 must lie
# between the merged histogram's values at 98.9 and 99.1 %.
lo = min(merged.get_value_at_percentile(98.9), mx) / 1000
hi = min(merged.get_value_at_percentile(99.1), mx) / 1000
assert lo - 1e-9 <= m["latency_us"]["p99"] <= hi + 1e-9, (m["latency_us"], lo, p99, hi)
print(f"test-cluster: merged ops {m['ops']} = {' + '.join(str(p['ops']) for p in parts)}; p99 {p99} us from the merged histograms")
PY
leftovers() { pgrep -f "memory-blade --listen 127.0.0.1:($p1|$p2)|smart-rs-[0-9]+-run-|$work/client_key" || true; }
leftover=$(leftovers)
[ -z "$leftover" ] || { echo "test-cluster: processes left after the run: $(ps -o pid,args -p $leftover)" >&2; exit 1; }

# start_long_run NAME: a 60 s run of two compute blades in the background
# (sets run_pid); returns once both are past the barrier (measuring).
start_long_run() {
  local name=$1
  scripts/cluster run --cluster "$work/cluster.toml" --processes 2 --out "$work/$name" -- \
    ycsb --workload c --keys 5000 --threads 1 --coroutines 4 --duration 60 --warmup 0.2 >"$work/$name.out" 2>&1 &
  run_pid=$!
  for _ in $(seq 300); do
    [ "$(cat "$work/$name"/logs/*-run-p*.log 2>/dev/null | grep -c 'released after')" = 2 ] && return 0
    sleep 0.1
  done
  echo "test-cluster: $name: the compute blades never started measuring" >&2
  cat "$work/$name.out" >&2
  exit 1
}

# end_run NAME: waits for the launcher (sets status and took), shows what it
# said, and checks that it stopped well before the run's 60 s and left no
# process of the run behind.
end_run() {
  local name=$1 start
  start=$(date +%s)
  status=0
  wait "$run_pid" || status=$?
  run_pid=
  took=$(( $(date +%s) - start ))
  cat "$work/$name.out"
  [ "$took" -lt 45 ] || { echo "test-cluster: $name: the launcher took ${took}s to stop (the run was 60 s)" >&2; exit 1; }
  sleep 0.5
  leftover=$(leftovers)
  [ -z "$leftover" ] || { echo "test-cluster: $name: processes left: $(ps -o pid,args -p $leftover)" >&2; exit 1; }
}

echo "== a compute blade SIGKILLed mid-run"
start_long_run killed
victim=$(pgrep -f "^$PWD/$bin/compute-blade ycsb.*smart-rs-[0-9]+-run-1.json" | head -1 || true)
[ -n "$victim" ] || { echo "test-cluster: no second compute blade to kill" >&2; exit 1; }
kill -KILL "$victim"
end_run killed
[ "$status" -ne 0 ] || { echo "test-cluster: the launcher exited 0 after a compute blade was killed" >&2; exit 1; }
grep -q "failed" "$work/killed.out" || { echo "test-cluster: the launcher did not say what failed" >&2; exit 1; }
ls "$work"/killed/logs/*memory-blade-1.log "$work"/killed/logs/*-run-p2.log >/dev/null
echo "test-cluster: killed compute blade $victim; launcher exited $status after ${took}s; nothing left running; logs kept"

echo "== Ctrl-C (SIGINT) to the launcher mid-run"
start_long_run interrupted
kill -INT "$run_pid"
end_run interrupted
[ "$status" -eq 130 ] || { echo "test-cluster: the interrupted launcher exited $status, not 130" >&2; exit 1; }
echo "test-cluster: SIGINT stopped the run in ${took}s (status 130); nothing left running"

echo "== the launcher's unit tests"
python3 -m unittest discover -s scripts/smartrs -p 'test_*.py' -v 2>&1 | tail -3
echo "test-cluster: ok"
