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

# start_blade DIR ARGS...: starts memory-blade on 127.0.0.1 (a free port)
# with ARGS, its stdout in DIR/blade.out; sets BLADE_PID and BLADE_ADDR.
start_blade() {
  local dir=$1
  shift
  "$bin/memory-blade" --listen 127.0.0.1:0 "$@" >"$dir/blade.out" &
  BLADE_PID=$!
  for _ in $(seq 100); do
    grep -q '^ready ' "$dir/blade.out" 2>/dev/null && break
    sleep 0.1
  done
  BLADE_ADDR=$(awk '/^ready /{print $2}' "$dir/blade.out")
  if [ -z "$BLADE_ADDR" ]; then
    echo "memory-blade never printed its ready line" >&2
    return 1
  fi
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
    "$bin/memory-blade" --listen 127.0.0.1:0 "$@" >"$dir/blade$i.out" &
    BLADE_PIDS+=($!)
    for _ in $(seq 100); do
      grep -q '^ready ' "$dir/blade$i.out" 2>/dev/null && break
      sleep 0.1
    done
    addrs+=("$(awk '/^ready /{print $2}' "$dir/blade$i.out")")
    if [ -z "${addrs[-1]}" ]; then
      echo "memory-blade $i never printed its ready line" >&2
      return 1
    fi
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
