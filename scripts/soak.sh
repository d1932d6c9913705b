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
#
#   scripts/soak.sh --sim [SEEDS] [FIRST]
#
# Deterministic simulation testing instead: seeds FIRST.. FIRST+SEEDS-1
# (defaults 20 and 1), each a run of a workload on the simulated transport
# at 96 threads x 8 coroutines (THREADS, COROUTINES override; blades of
# SIM_BLADE_SIZE, default 1GiB) with one
# fault drawn from the seed (--sim-fault-seed: a compute blade killed, a
# memory blade down and back, a memory blade or a thread stalled, a QP
# dropped; for smallbank and tatp, whose tables are replicated, also a
# memory blade lost with its memory), then the
# application's recovery and its own invariant checks on the blades the
# run left (smallbank/tatp: recover, or rebuild --lost B after a blade
# lost, then --audit-only; race: table repair,
# table check, ycsb --no-load --verify; sherman: table check, ycsb
# --no-load --verify). The seed picks the workload too. The run may fail
# with a transport error or die (that is the fault); a panic, a failed
# audit, check or verify fails the seed. A seed's run is the same bit for
# bit every time, so a failure reproduces with the one command printed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --sim ]; then
  seeds=${2:-20}
  first=${3:-1}
  for n in "$seeds" "$first"; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "usage: scripts/soak.sh --sim [SEEDS] [FIRST] (whole numbers)" >&2; exit 2; }
  done
  threads=${THREADS:-96}
  coroutines=${COROUTINES:-8}
  out=${OUT:-results/soak-sim}
  # Errors are judged by their messages: no backtraces in between.
  export RUST_BACKTRACE=0
  mkdir -p "$out"
  echo "building compute-blade" >&2
  cargo build --release -q --bin compute-blade
  bin=${CARGO_TARGET_DIR:-target}/release/compute-blade
  failed=0
  for seed in $(seq "$first" $((first + seeds - 1))); do
    dir="$out/seed-$seed"
    rm -rf "$dir"
    mkdir -p "$dir"
    log="$dir/log"
    # Blade files get their disk space up front (posix_fallocate): 1 GiB
    # each, not the simulator's 4 GiB default, which these workloads never
    # fill; a failed seed keeps its directory.
    sim=(--transport sim --sim-blade-dir "$dir" --blade-size "${SIM_BLADE_SIZE:-1GiB}")
    # The workload and its recovery and checks, by the seed.
    case $((seed % 4)) in
      0) name=smallbank
        run=(smallbank --accounts 20000 --audit)
        recover=(recover --db smallbank --sim-advance 12)
        checks=("smallbank --accounts 20000 --audit-only") ;;
      1) name=tatp
        run=(tatp --subscribers 20000 --audit)
        recover=(recover --db tatp --sim-advance 12)
        checks=("tatp --subscribers 20000 --audit-only") ;;
      2) name="ycsb race"
        run=(ycsb --app race --workload a --keys 20000 --verify)
        recover=(table repair ycsb --sim-advance 3)
        checks=("table check ycsb" "ycsb --app race --workload a --keys 20000 --no-load --verify --threads 8 --duration 0.001 --warmup 0") ;;
      3) name="ycsb sherman"
        run=(ycsb --app sherman --workload e --keys 20000 --verify)
        recover=(table check ycsb --app sherman --sim-advance 3)
        checks=("ycsb --app sherman --workload e --keys 20000 --no-load --verify --threads 8 --duration 0.001 --warmup 0") ;;
    esac
    t0=$(date +%s)
    step() { # step WHAT OK_CODES ARGS...: run one command, log it, check its status
      local what=$1 ok=$2
      shift 2
      echo "\$ $bin $*" >>"$log"
      set +e
      "$bin" "$@" >"$dir/step" 2>&1
      local rc=$?
      set -e
      cat "$dir/step" >>"$log"
      echo "(exit $rc)" >>"$log"
      if [[ " $ok " != *" $rc "* ]]; then
        why="$what exited with $rc"
        return 1
      fi
      # A run that failed must have failed from its fault (its error says
      # so), not from its own check.
      if [ "$rc" = 1 ] && { grep -q "VIOLATION" "$dir/step" ||
        ! grep -qE "^(Error|compute-blade: error): .*(memory blade is unreachable|queue pair is in the error state)|coroutine\(s\) failed; first: .*(memory blade is unreachable|queue pair is in the error state)" "$dir/step"; }; then
        why="$what failed, not from a transport fault"
        return 1
      fi
    }
    why=""
    ok=1
    step "the run" "0 1 137" "${run[@]}" --threads "$threads" --coroutines "$coroutines" --duration 0.004 --warmup 0.001 \
      --seed "$seed" --sim-fault-seed "$seed" --quiet "${sim[@]}" || ok=0
    fault=$(grep -o -- "--sim-fault [^ ]*" "$log" | head -1 | sed 's/--sim-fault //' || true)
    # A memory blade lost: a fresh one is in its place; the database's
    # copies come back from the others, and the dead run is recovered.
    if [[ $fault =~ ^blade-lost@[0-9.]+:([0-9]+)$ ]]; then
      recover=(rebuild --lost "${BASH_REMATCH[1]}" --sim-advance 12)
    fi
    [ "$ok" = 1 ] && { step "recovery" "0" "${recover[@]}" "${sim[@]}" || ok=0; }
    for c in "${checks[@]}"; do
      [ "$ok" = 1 ] || break
      # shellcheck disable=SC2086 # the checks are word lists
      step "check '$c'" "0" $c "${sim[@]}" || ok=0
    done
    if [ "$ok" = 1 ]; then
      echo "seed $seed: $name, fault ${fault:-none}: passed ($(($(date +%s) - t0)) s)" >&2
      rm -rf "$dir"
    else
      echo "seed $seed: $name, fault ${fault:-none}: FAILED: $why; commands and output in $log" >&2
      tail -n 8 "$log" | sed 's/^/    /' >&2
      echo "reproduce: scripts/soak.sh --sim 1 $seed" >&2
      failed=$((failed + 1))
    fi
  done
  echo "$((seeds - failed)) of $seeds seed(s) passed" >&2
  [ "$failed" = 0 ]
  exit
fi
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
