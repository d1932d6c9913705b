# Sourced by the guest helpers of the Soft-RoCE VM (busybox sh).

# start_blade LOG [memory-blade args]: starts a verbs memory-blade on
# 127.0.0.1 (a free port), its output in LOG; sets BLADE_PID and BLADE_ADDR.
# Returns 1, with the blade's output, if it never prints its ready line.
start_blade() {
  _log=$1
  shift
  memory-blade --listen 127.0.0.1:0 --transport verbs --device "$SMART_RDMA_DEVICE" "$@" >"$_log" 2>&1 &
  BLADE_PID=$!
  BLADE_ADDR=
  for _ in $(seq 600); do
    BLADE_ADDR=$(awk '/^ready /{print $2}' "$_log")
    [ -n "$BLADE_ADDR" ] && return 0
    kill -0 "$BLADE_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "memory-blade never printed its ready line:" >&2
  cat "$_log" >&2
  kill -KILL "$BLADE_PID" 2>/dev/null
  return 1
}
