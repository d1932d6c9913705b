#!/usr/bin/env python3
"""The applications' CPU time per doorbell for the simulator's profile
([app] section), from instruction counts: never from the host's clock.

  scripts/sim-app-costs.py [--ghz G] [--ipc I]

For micro (8-byte READs) and each application workload, on the embedded
backend at 1 thread x 8 coroutines with --smart none, it runs compute-blade
under valgrind's callgrind twice, measuring two lengths, and takes the
instructions per operation as the difference of the two counts over the
difference of their operations (the load and set-up cancel). An
operation's instructions beyond what micro spends per doorbell (the
runtime's post, poll and coroutine switch, which the profile's cpu.*
fields already charge) are the application's own work: hashing, parsing
buckets and pages, the transaction's bookkeeping. Per doorbell, at the
clock rate G GHz (default 2.4, the Smart testbed's Xeon Gold 6240R) and I
instructions per cycle (default 1.0), they give the profile's
app.<name>_ns. The embedded backend also executes the verbs in the same
instructions (copies of the bytes read and written); that cost is
subtracted per verb at micro's rate only, so larger WRs count a little
extra. Prints a table and the [app] section to paste into a profile.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "compute-blade")
COMMON = ["--threads", "1", "--coroutines", "8", "--smart", "none", "--warmup", "0.05", "--quiet",
          "--blade-size", "256MiB"]
WORKLOADS = [
    ("micro", None, ["micro", "--op", "read", "--size", "8"]),
    ("race a", "race", ["ycsb", "--app", "race", "--workload", "a", "--keys", "20000"]),
    ("race b", "race", ["ycsb", "--app", "race", "--workload", "b", "--keys", "20000"]),
    ("race c", "race", ["ycsb", "--app", "race", "--workload", "c", "--keys", "20000"]),
    ("race update-only", "race", ["ycsb", "--app", "race", "--workload", "update-only", "--keys", "20000"]),
    ("sherman a", "sherman", ["ycsb", "--app", "sherman", "--workload", "a", "--keys", "20000"]),
    ("sherman b", "sherman", ["ycsb", "--app", "sherman", "--workload", "b", "--keys", "20000"]),
    ("sherman c", "sherman", ["ycsb", "--app", "sherman", "--workload", "c", "--keys", "20000"]),
    ("smallbank", "ford", ["smallbank", "--accounts", "20000"]),
    ("tatp", "ford", ["tatp", "--subscribers", "20000"]),
]


def measure(args, secs):
    """(instructions, operations, doorbells per op, verbs per op) of one run."""
    with tempfile.TemporaryDirectory() as d:
        rec, out = os.path.join(d, "r.json"), os.path.join(d, "cg.out")
        p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", BIN] + args + COMMON
                           + ["--duration", str(secs), "--json", rec], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"failed: {' '.join(args)}\n{p.stderr[-2000:]}")
        m = re.search(r"Collected : (\d+)", p.stderr)
        r = json.load(open(rec))
    # Per operation (a committed transaction for SmallBank and TATP, the
    # work of its aborted attempts included).
    return int(m.group(1)), r["ops"], r["doorbells_per_op"], r["verbs_per_op"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ghz", type=float, default=2.4)
    ap.add_argument("--ipc", type=float, default=1.0)
    ap.add_argument("--short", type=float, default=0.2, help="wall seconds of the shorter run (default 0.2)")
    a = ap.parse_args()
    if not os.path.exists(BIN):
        subprocess.run(["cargo", "build", "--release", "-q", "--bin", "compute-blade"], cwd=ROOT, check=True)
    rows = []
    for name, app, args in WORKLOADS:
        i1, o1, db, vb = measure(args, a.short)
        i2, o2, db2, vb2 = measure(args, a.short * 3)
        per_op = (i2 - i1) / max(o2 - o1, 1)
        rows.append((name, app, per_op, db2, vb2))
        print(f"{name}: {per_op:.0f} instructions per op, {db2:.2f} doorbells and {vb2:.2f} verbs per op",
              file=sys.stderr)
    micro = rows[0][2]  # instructions per doorbell (one READ each)
    print("| workload | instructions per op | doorbells per op | verbs per op | beyond micro, per doorbell | ns per doorbell |")
    print("|---|---|---|---|---|---|")
    per_app = {}
    for name, app, per_op, db, vb in rows:
        extra = max(per_op - micro * db, 0.0) / db
        ns = extra / (a.ghz * a.ipc)
        print(f"| {name} | {per_op:.0f} | {db:.2f} | {vb:.2f} | {extra:.0f} | {ns:.0f} |")
        if app:
            per_app.setdefault(app, []).append(ns)
    print(f"\n[app]  # {a.ghz} GHz, IPC {a.ipc}; the mean over each application's workloads")
    for app, v in per_app.items():
        print(f"{app}_ns = {round(sum(v) / len(v))}")


if __name__ == "__main__":
    main()
