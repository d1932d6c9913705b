#!/usr/bin/env bash
# Runs the three examples of the tutorial (examples/: counter, spinlock,
# own_index) as a user runs them: on the embedded backend, then over TCP
# against a memory-blade this script starts on loopback (and stops, by PID).
# Each example checks its own result and exits non-zero when it fails.
# Usage: scripts/examples.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
out=${OUT:-target/examples-run}
prepare "$out"
cargo build --release --quiet --examples

for ex in counter spinlock own_index; do
  echo "== example $ex (embedded)"
  "target/release/examples/$ex" --threads 2 --coroutines 8
done

start_blade "$out" --size 256MiB
for ex in counter spinlock own_index; do
  echo "== example $ex (tcp, $BLADE_ADDR)"
  "target/release/examples/$ex" --blades "$BLADE_ADDR" --threads 2 --coroutines 4 --ops 2000
done
stop_blade
echo "examples: all passed"
