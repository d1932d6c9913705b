#!/usr/bin/env bash
# Soak the concurrency tests: run the integration tests of smart-core,
# race-ht, ford-dtx, sherman-bt and smallbank-tatp round after round, each
# round with a new random SMART_CHAOS_SEED, which every chaos-backend test
# mixes into its own seed (smart_testkit::backends::chaos_seed): new
# delays, reorders and torn lines each round, where `cargo test` alone
# repeats the same ones. Stops at the first failing round, keeps its
# output, and prints the seed that reproduces it.
#
#   scripts/soak.sh [ROUNDS] [MINUTES]
#
# ROUNDS (default 20) and MINUTES (default 60) bound the run: it ends at
# whichever comes first (a round already started finishes). Logs go to
# $OUT (default results/soak). Exit 0 if every round passed, 1 on a
# failure.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
minutes=${2:-60}
for n in "$rounds" "$minutes"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "usage: scripts/soak.sh [ROUNDS] [MINUTES] (positive whole numbers)" >&2; exit 2; }
done
out=${OUT:-results/soak}
mkdir -p "$out"
tests=(-p smart-core -p race-ht -p ford-dtx -p sherman-bt --test it)
echo "building the tests" >&2
cargo test --release --no-run -q "${tests[@]}"
cargo test --release --no-run -q -p smallbank-tatp --test workloads
end=$(($(date +%s) + minutes * 60))
passed=0
for r in $(seq "$rounds"); do
  if [ "$(date +%s)" -ge "$end" ]; then
    echo "time is up after $passed rounds" >&2
    break
  fi
  seed=$(od -An -N6 -tu8 /dev/urandom | tr -d ' ')
  log="$out/round-$r.log"
  t0=$(date +%s)
  if SMART_CHAOS_SEED=$seed cargo test --release -q "${tests[@]}" >"$log" 2>&1 &&
    SMART_CHAOS_SEED=$seed cargo test --release -q -p smallbank-tatp --test workloads >>"$log" 2>&1; then
    passed=$((passed + 1))
    echo "round $r: SMART_CHAOS_SEED=$seed passed ($(($(date +%s) - t0)) s)" >&2
    rm -f "$log"
  else
    echo "round $r: SMART_CHAOS_SEED=$seed FAILED; output in $log" >&2
    grep -E -- "--- FAILED|panicked at|^---- " "$log" | head -20 >&2 || true
    echo "reproduce a failing test above: SMART_CHAOS_SEED=$seed cargo test --release -p CRATE --test it -- TEST" >&2
    echo "(smallbank-tatp's tests are in --test workloads)" >&2
    exit 1
  fi
done
echo "$passed round(s) passed" >&2
