#!/usr/bin/env bash
# The launcher's ssh path against a real sshd on 127.0.0.1 (Debian's
# openssh-server, a throw-away host key and client key, this user):
#  1. `scripts/cluster preflight` over ssh;
#  2. two memory blades and two compute blades, all started over ssh, with a
#     barrier; the merged record's ops equal the sum of the parts' and its
#     p99 equals the p99 of the parts' histograms merged (recomputed here,
#     independently of compute-blade merge);
#  3. a compute blade SIGKILLed mid-run: the launcher stops everything it
#     started and exits non-zero, and no process of the run is left;
#  4. SIGINT (Ctrl-C) to the launcher mid-run: the same, with status 130.
# Then the launcher's unit tests (cluster files, the srun command lines).
#
#   scripts/test-cluster.sh [path/to/target/release]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release}
[ -x /usr/sbin/sshd ] || { echo "test-cluster: needs openssh-server (/usr/sbin/sshd)" >&2; exit 1; }
work=$(mktemp -d /tmp/smart-rs-cluster-test.XXXXXX)
sshd_pid=
run_pid=
cleanup() {
  [ -n "$run_pid" ] && kill -KILL "$run_pid" 2>/dev/null || true
  [ -n "$sshd_pid" ] && kill -TERM "$sshd_pid" 2>/dev/null || true
  # Anything of this test's run still alive is a failure of the launcher;
  # it is reported above, and ended here.
  pkill -KILL -f "memory-blade --listen 127.0.0.1:(${p1:-x}|${p2:-x})|smart-rs-[0-9]+-run-|$work/client_key" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$work/client_key"
cp "$work/client_key.pub" "$work/authorized_keys"
chmod 600 "$work/authorized_keys"
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
sshd_pid=$!
opts=(-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -i "$work/client_key")
for _ in $(seq 100); do
  ssh -p "$port" "${opts[@]}" -o BatchMode=yes 127.0.0.1 true 2>/dev/null && break
  kill -0 "$sshd_pid" 2>/dev/null || { cat "$work/sshd.log" >&2; exit 1; }
  sleep 0.1
done
echo "test-cluster: sshd on 127.0.0.1:$port (pid $sshd_pid)"

p1=$(free_port)
p2=$(free_port)
cat >"$work/cluster.toml" <<EOF
# Every process over ssh to 127.0.0.1 (this test's sshd).
[defaults]
transport = "tcp"
launch = "ssh"
ssh_port = $port
ssh_options = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-i", "$work/client_key"]
workdir = "$PWD"
bin = "$bin"

[[memory_blade]]
host = "127.0.0.1"
listen = "127.0.0.1"
port = $p1
size = "128MiB"

[[memory_blade]]
host = "127.0.0.1"
listen = "127.0.0.1"
port = $p2
size = "128MiB"

[[compute_blade]]
host = "127.0.0.1"
threads = 1

[[compute_blade]]
host = "127.0.0.1"
threads = 1
EOF
export SMART_RS_NO_BUILD=1 SMART_RS_SSH_CONTROL_DIR=$work

echo "== preflight over ssh"
scripts/cluster preflight --cluster "$work/cluster.toml"

echo "== two memory blades and two compute blades over ssh, with a barrier"
scripts/cluster run --cluster "$work/cluster.toml" --processes 2 --out "$work/run" -- \
  ycsb --workload c --keys 5000 --threads 1 --coroutines 4 --duration 1 --warmup 0.2
python3 - "$work/run" "$work/cluster.toml" <<'PY'
import hashlib, json, sys
from pathlib import Path
d = Path(sys.argv[1])
m = json.loads((d / "merged.json").read_text())
parts = [json.loads((d / "logs" / f"run-p{i}.json").read_text()) for i in (1, 2)]
assert m["processes"] == 2 and m["blades"] == 2, m
assert m["ops"] == sum(p["ops"] for p in parts) > 0, (m["ops"], [p["ops"] for p in parts])
sha = hashlib.sha256(Path(sys.argv[2]).read_bytes()).hexdigest()
for p in parts:
    assert p["provenance"]["cluster_file_sha256"] == sha, p["provenance"]
    assert "--barrier" in p["provenance"]["command"], p["provenance"]["command"]
# The p99 of the merged histograms, recomputed from the serialized buckets
# (bucket midpoints, as the record documents them).
counts, n, mx = {}, 0, 0
for p in parts:
    h = p["latency_hist"]
    assert h["unit"] == "ns"
    for i, c in h["buckets"]:
        counts[i] = counts.get(i, 0) + c
        n += c
    mx = max(mx, h["max"])
sub_bits = parts[0]["latency_hist"]["sub_bits"]
sub = 1 << sub_bits
def midpoint(i):
    if i < sub:
        return i
    e = i // sub + sub_bits - 1
    shift = e - sub_bits
    return ((sub + i % sub) << shift) + ((1 << shift) >> 1)
import math
rank, seen = max(math.ceil(0.99 * n), 1), 0
for i in sorted(counts):
    seen += counts[i]
    if seen >= rank:
        p99 = min(midpoint(i), mx) / 1000
        break
assert abs(m["latency_us"]["p99"] - p99) < 1e-9, (m["latency_us"], p99)
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
