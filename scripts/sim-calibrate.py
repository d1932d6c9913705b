#!/usr/bin/env python3
"""Fits the simulator's hardware profile to the Smart artifact's micro-benchmark
curves (figures 3a, 3b, 4 and 5 only), and reports the fit.

Usage:
  scripts/sim-calibrate.py [--profile FILE] [--sweeps N] [--jobs J]
                           [--write FILE] [--report-only] [--out DIR]

For each reference point of the artifact (scripts/smartrs/reference/), it runs
the same measurement on the simulated cluster, in virtual time:

  3a / 3b  compute-blade micro --op read|write --size 8 --coroutines 1
           --depth 8 --smart none --qp-policy P, by threads (the artifact's
           test_rdma posts 8 WRs, a doorbell each, then waits for all)
  4        the same with --qp-policy per-thread-db, by threads and depth
  5        compute-blade ycsb --app race --workload update-only --smart none
           --coroutines 8 (Zipf 0.99), by threads

The fit minimises the mean of |ln(simulated / paper)| over every point, by
coordinate descent on the profile's parameters named in FIT below
(multiplicative steps that shrink when no move helps). The simulation is
deterministic, so the search is too. --report-only evaluates the profile as
it is. The report (per curve: the median and worst |ln ratio|, and the thread
count of the peak, ours against the paper's) goes to OUT/report.md and
OUT/report.json; --write FILE writes the fitted values into a copy of the
profile (its comments kept).

Needs the release binaries (cargo build --release) and Python 3 only.
"""
import argparse
import concurrent.futures
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF = os.path.join(ROOT, "scripts", "smartrs", "reference")
BIN = os.path.join(ROOT, "target", "release", "compute-blade")

POLICIES = {
    "shared QP": "shared",
    "multiplexed QP (4 thr/QP)": "multiplexed:4",
    "multiplexed QP (2 thr/QP)": "multiplexed:2",
    "per-thread QP": "per-thread-qp",
    "per-thread doorbell": "per-thread-db",
}
# Thread counts fitted per curve (the reference has more; these span it).
THREADS = {1, 8, 16, 24, 32, 48, 64, 96}
FIG4_THREADS = {12, 24, 48, 72, 96}

# The parameters fitted, as (section, key, minimum, maximum, integer).
FIT = [
    ("cpu", "post_doorbell_ns", 10, 2000, True),
    ("cpu", "op_ns", 10, 5000, True),
    ("cpu", "poll_ns", 5, 500, True),
    ("network", "latency_ns", 100, 3000, True),
    ("memory", "dma_read_ns", 50, 3000, True),
    ("nic", "wqe_ns", 10, 500, True),
    ("nic", "cache_wrs", 64, 8192, True),
    ("nic", "miss_ns", 50, 5000, True),
    ("doorbell", "lock_ns", 5, 2000, True),
    ("doorbell", "line_transfer_ns", 5, 2000, True),
    ("doorbell", "waiter_penalty_ns", 0, 500, True),
    ("memory", "atomic_ns", 50, 5000, True),
    ("memory", "op_ns", 10, 1000, True),
]


def read_reference(fig):
    rows = []
    with open(os.path.join(REF, f"{fig}.csv")) as f:
        for line in f:
            if line.startswith("#") or line.startswith("panel,") or not line.strip():
                continue
            panel, series, x, y = line.strip().split(",")
            rows.append((panel, series, float(x), float(y)))
    return rows


def points():
    """(curve, x, paper's Mop/s, compute-blade arguments) of every point fitted."""
    pts = []
    for fig, op in (("fig3a", "read"), ("fig3b", "write")):
        for _, series, x, y in read_reference(fig):
            if series in POLICIES and int(x) in THREADS:
                args = ["micro", "--op", op, "--size", "8", "--coroutines", "1", "--depth", "8",
                        "--qp-policy", POLICIES[series], "--threads", str(int(x)), "--area", "1MiB"]
                pts.append((f"{fig} {series}", int(x), y, args))
    for _, series, x, y in read_reference("fig4"):
        depth = int(series.split()[-1])
        if int(x) in FIG4_THREADS:
            args = ["micro", "--op", "read", "--size", "8", "--coroutines", "1", "--depth", str(depth),
                    "--qp-policy", "per-thread-db", "--threads", str(int(x)), "--area", "1MiB"]
            pts.append((f"fig4 {series}", int(x), y, args))
    for _, series, x, y in read_reference("fig5"):
        args = ["ycsb", "--app", "race", "--workload", "update-only", "--keys", "100000", "--coroutines", "8",
                "--threads", str(int(x))]
        pts.append((f"fig5 {series}", int(x), y, args))
    return pts


def parse_profile(path):
    """The profile's `key = value` lines by section (values as text)."""
    vals, section = {}, None
    with open(path) as f:
        for line in f:
            m = re.match(r"^\[(\w+)\]", line)
            if m:
                section = m.group(1)
                continue
            m = re.match(r"^(\w+)\s*=\s*([^#\n]+)", line)
            if m and section:
                vals[(section, m.group(1))] = m.group(2).strip()
    return vals


def write_profile(template, values, path):
    """`template` with `values` ({(section, key): number}) put in."""
    out, section = [], None
    with open(template) as f:
        for line in f:
            m = re.match(r"^\[(\w+)\]", line)
            if m:
                section = m.group(1)
            m = re.match(r"^(\w+)(\s*=\s*)([^#\n]+)(.*)$", line.rstrip("\n"))
            if m and (section, m.group(1)) in values:
                v = values[(section, m.group(1))]
                line = f"{m.group(1)}{m.group(2)}{v}{m.group(4)}\n"
            out.append(line)
    with open(path, "w") as f:
        f.writelines(out)


def run_point(profile, args, quick):
    dur, warm = ("0.001", "0.0003") if quick else ("0.002", "0.0005")
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as t:
        rec = t.name
    cmd = [BIN] + args + ["--transport", "sim", "--sim-profile", profile, "--smart", "none",
                          "--duration", dur, "--warmup", warm, "--seed", "1", "--quiet",
                          "--blade-size", "128MiB", "--json", rec]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr[-2000:]}")
    with open(rec) as f:
        v = json.load(f)
    os.unlink(rec)
    return v["throughput_mops"]


def evaluate(profile, pts, jobs, quick):
    with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
        ours = list(ex.map(lambda p: run_point(profile, p[3], quick), pts))
    errs = [abs(math.log(max(o, 1e-6) / y)) for o, (_, _, y, _) in zip(ours, pts)]
    return sum(errs) / len(errs), ours


def report(pts, ours, out):
    curves = {}
    for (curve, x, y, _), o in zip(pts, ours):
        curves.setdefault(curve, []).append((x, y, o))
    rows = []
    for curve, ps in curves.items():
        ps.sort()
        errs = sorted(abs(math.log(max(o, 1e-6) / y)) for _, y, o in ps)
        med = errs[len(errs) // 2] if len(errs) % 2 else (errs[len(errs) // 2 - 1] + errs[len(errs) // 2]) / 2
        peak_paper = max(ps, key=lambda p: p[1])[0]
        peak_ours = max(ps, key=lambda p: p[2])[0]
        rows.append({"curve": curve, "points": len(ps), "median_abs_ln": med, "worst_abs_ln": errs[-1],
                     "peak_threads_paper": peak_paper, "peak_threads_ours": peak_ours,
                     "values": [{"x": x, "paper": y, "sim": o} for x, y, o in ps]})
    allerr = sorted(abs(math.log(max(o, 1e-6) / y)) for (_, _, y, _), o in zip(pts, ours))
    med_all = allerr[len(allerr) // 2]
    lines = ["| curve | points | median \\|ln(sim / paper)\\| | worst | peak at (threads), paper | sim |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['curve']} | {r['points']} | {r['median_abs_ln']:.2f} | {r['worst_abs_ln']:.2f} | "
                     f"{r['peak_threads_paper']} | {r['peak_threads_ours']} |")
    lines.append(f"| **all** | {len(allerr)} | **{med_all:.2f}** | {allerr[-1]:.2f} | | |")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=os.path.join(ROOT, "smart-sim", "profiles", "connectx6.toml"))
    ap.add_argument("--sweeps", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--write", help="write the fitted profile here")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--quick", action="store_true", help="shorter runs (1 ms measured)")
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "sim-calibration"))
    a = ap.parse_args()
    if a.sweeps < 0 or a.jobs < 1:
        sys.exit("--sweeps must be at least 0 and --jobs at least 1")
    if not os.access(BIN, os.X_OK):
        sys.exit(f"{BIN} is missing: run cargo build --release first")
    pts = points()
    base = parse_profile(a.profile)
    vals = {}
    for s, k, lo, hi, integer in FIT:
        if (s, k) not in base:
            sys.exit(f"{a.profile}: no {s}.{k}")
        vals[(s, k)] = int(base[(s, k)]) if integer else float(base[(s, k)])
    tmpdir = tempfile.mkdtemp(prefix="sim-calibrate-")
    trial = os.path.join(tmpdir, "trial.toml")
    t0 = time.time()
    evals = 0

    def score(v):
        nonlocal evals
        write_profile(a.profile, v, trial)
        evals += 1
        return evaluate(trial, pts, a.jobs, a.quick)

    best, ours = score(vals)
    print(f"start: mean |ln ratio| {best:.3f} over {len(pts)} points ({time.time() - t0:.0f} s)", flush=True)
    step = {key: 1.5 for key in vals}
    for sweep in range(0 if a.report_only else a.sweeps):
        moved = False
        for s, k, lo, hi, integer in FIT:
            key = (s, k)
            improved = False
            for factor in (step[key], 1 / step[key]):
                # A line search: keep going while it helps.
                while True:
                    v = dict(vals)
                    x = min(max(vals[key] * factor, lo), hi)
                    v[key] = int(round(x)) if integer else x
                    if v[key] == vals[key]:
                        break
                    sc, o = score(v)
                    if sc >= best - 1e-4:
                        break
                    best, ours, vals, moved, improved = sc, o, v, True, True
                    print(f"sweep {sweep + 1}: {s}.{k} = {v[key]}: mean |ln ratio| {best:.3f} "
                          f"({evals} evaluations, {time.time() - t0:.0f} s)", flush=True)
                if improved:
                    break
            if not improved:
                step[key] = 1 + (step[key] - 1) / 2
        if not moved and all(x < 1.05 for x in step.values()):
            break
    print(report(pts, ours, a.out))
    print(f"mean |ln ratio| {best:.3f}; {evals} evaluations in {time.time() - t0:.0f} s; report in {a.out}")
    print("fitted: " + ", ".join(f"{s}.{k} = {vals[(s, k)]}" for s, k, *_ in FIT))
    if a.write:
        write_profile(a.profile, vals, a.write)
        print(f"wrote {a.write}")


if __name__ == "__main__":
    main()
