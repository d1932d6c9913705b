# Shared by the scripts (source it from the repository root): building,
# and a memory-blade on loopback.

# prepare OUT: makes OUT, builds the release binaries, sets $bin, and ends
# any blade this script started when it exits.
prepare() {
  mkdir -p "$1"
  cargo build --release --quiet
  bin=target/release
  trap kill_blade EXIT
}

# launch_blade OUTFILE ARGS...: starts memory-blade on 127.0.0.1 (a free
# port) with ARGS, its stdout in OUTFILE, and waits for its ready line; sets
# LAUNCHED_PID and LAUNCHED_ADDR.
launch_blade() {
  local outfile=$1
  shift
  "$bin/memory-blade" --listen 127.0.0.1:0 "$@" >"$outfile" &
  LAUNCHED_PID=$!
  for _ in $(seq 100); do
    grep -q '^ready ' "$outfile" 2>/dev/null && break
    sleep 0.1
  done
  LAUNCHED_ADDR=$(awk '/^ready /{print $2}' "$outfile")
  if [ -z "$LAUNCHED_ADDR" ]; then
    echo "memory-blade ($outfile) never printed its ready line" >&2
    return 1
  fi
}

# start_blade DIR ARGS...: one blade, its stdout in DIR/blade.out; sets
# BLADE_PID and BLADE_ADDR.
start_blade() {
  local dir=$1
  shift
  launch_blade "$dir/blade.out" "$@" || return 1
  BLADE_PID=$LAUNCHED_PID
  BLADE_ADDR=$LAUNCHED_ADDR
}

# stop_blade: SIGTERM, and wait for the clean exit.
stop_blade() {
  [ -n "${BLADE_PID:-}" ] || return 0
  kill -TERM "$BLADE_PID"
  wait "$BLADE_PID" || true
  BLADE_PID=
}

# kill_blade: for traps; ends a blade that is still running.
kill_blade() {
  if [ -n "${BLADE_PID:-}" ] && kill -0 "$BLADE_PID" 2>/dev/null; then
    kill -KILL "$BLADE_PID" 2>/dev/null || true
  fi
}

# start_blades N DIR ARGS...: starts N memory-blades like start_blade; sets
# BLADES (their addresses, comma-separated) and BLADE_PIDS.
BLADE_PIDS=()
start_blades() {
  local n=$1 dir=$2 addrs=()
  shift 2
  for i in $(seq "$n"); do
    launch_blade "$dir/blade$i.out" "$@" || return 1
    BLADE_PIDS+=("$LAUNCHED_PID")
    addrs+=("$LAUNCHED_ADDR")
  done
  BLADES=$(IFS=,; echo "${addrs[*]}")
}

# stop_blades: SIGTERM to every blade start_blades started; waits.
stop_blades() {
  local p
  for p in "${BLADE_PIDS[@]}"; do
    kill -TERM "$p" 2>/dev/null || true
    wait "$p" || true
  done
  BLADE_PIDS=()
}

# kill_blades: for traps.
kill_blades() {
  local p
  for p in "${BLADE_PIDS[@]}"; do
    kill -KILL "$p" 2>/dev/null || true
  done
  kill_blade
}

# build_base REV WORKTREE BINS...: builds this tree's BINS (cargo --bin
# names) and REV's in a git worktree at WORKTREE (made on first use, moved to
# REV each time); sets $new and $base, the two target/release directories.
build_base() {
  local rev=$1 wt=$2 bins=()
  shift 2
  for b in "$@"; do bins+=(--bin "$b"); done
  cargo build --release --quiet "${bins[@]}"
  [ -d "$wt" ] || git worktree add --detach "$wt" "$rev" >/dev/null
  git -C "$wt" checkout --quiet --detach "$rev"
  (cd "$wt" && CARGO_TARGET_DIR=target cargo build --release --quiet "${bins[@]}")
  new=target/release
  base=$wt/target/release
}

# free_port: a loopback port nothing is bound to, below the kernel's
# ephemeral range: a port from that range may be given to any outgoing
# connection between this check and a later bind (test-cluster.sh's blades
# bind the same two ports scenario after scenario, among Slurm's daemons'
# connections), which would then fail with "Address already in use".
free_port() {
  python3 - <<'PY'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(500):
    port = random.randrange(10000, low)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("free_port: no free port below the ephemeral range")
PY
}
# Argument checks, before anything is built or started: each prints what
# was expected and exits 2.
# need_seconds NAME VALUE: a positive number (e.g. 3 or 0.5).
need_seconds() {
  if ! [[ $2 =~ ^([0-9]+(\.[0-9]*)?|\.[0-9]+)$ ]] || ! awk -v s="$2" 'BEGIN { exit !(s > 0) }'; then
    echo "$(basename "$0"): $1 must be a positive number of seconds, not \"$2\"" >&2
    exit 2
  fi
}
# need_count NAME VALUE: a positive whole number.
need_count() {
  if ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then
    echo "$(basename "$0"): $1 must be a positive whole number, not \"$2\"" >&2
    exit 2
  fi
}
# need_words NAME "VALUE" ALLOWED...: VALUE is one or more of ALLOWED.
need_words() {
  local name=$1 value=$2 w a ok
  shift 2
  [ -n "${value// /}" ] || { echo "$(basename "$0"): $name is empty (one or more of: $*)" >&2; exit 2; }
  for w in $value; do
    ok=0
    for a in "$@"; do [ "$w" = "$a" ] && ok=1; done
    [ $ok = 1 ] || { echo "$(basename "$0"): $name: \"$w\" is not one of: $*" >&2; exit 2; }
  done
}
# need_rev REV: a commit this repository has.
need_rev() {
  git rev-parse --verify --quiet "$1^{commit}" >/dev/null ||
    { echo "$(basename "$0"): no commit \"$1\" in this repository" >&2; exit 2; }
}
