"""One command per figure of the Smart paper's evaluation (Ren et al.,
ASPLOS '24) that Smart-rs supports: run the sweep on the cluster file's
machines, write every run's record as a JSON line, draw the figure (PNG and
PDF) in the paper's layout, with the paper's curve beside ours where the
artifact's reference results are known (normalised: different hardware, so
compare shapes).

    scripts/figure 8 --quick            # seconds per point, on this machine
    scripts/figure all --full --cluster my-cluster.toml
    scripts/figure 8 --plot-only        # redraw from results/figures/fig8.jsonl
    scripts/figure 8 --full --resume    # run only the points a stopped run lacks
    scripts/figure 8 --sim              # on the simulated cluster (smart-sim), the
                                        # paper's thread counts, in virtual time

With --sim every point runs on `compute-blade --transport sim` on this machine
(no cluster, no blades to start): the simulated ConnectX-6 cluster of
smart-sim's calibrated profile, at the paper's scale (up to 96 threads × 8
coroutines per compute blade, several compute blades for the scale-out
figures), in virtual time, deterministic (the same seed every run). Its
figures are labelled SIMULATED, and the paper's curves are drawn beside ours
in absolute numbers, not normalised.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster import REPO, LaunchError, Launcher, guarded, load_cluster, version_commit  # noqa: E402

# --smart settings of the paper's series.
RACE = "none"
SMART_HT = "thd-res-alloc,work-req-throt,conflict-avoid"
SHERMAN_PLUS = "thd-res-alloc,work-req-throt,conflict-avoid"
SMART_BT = "all"
# The steps of the paper's figure 14 (--conflict-avoid-parts; None: without
# ConflictAvoid).
CONFLICT_STEPS = [(None, "without ConflictAvoid"), ("backoff", "+Backoff"), ("dyn-limit", "+DynLimit"),
                  ("all", "+CoroThrot")]


@dataclass
class Point:
    panel: str
    series: str
    x: float
    args: list[str]  # the compute-blade subcommand and its flags (no blades, duration, json)
    processes: int = 1
    fresh_blades: bool = False  # restart the memory blades first (indexes whose memory a drop does not return)
    table: bool = False  # a YCSB table: named per run, dropped after it


@dataclass
class Metric:
    key: str  # record field (dotted for nested)
    label: str  # y axis, with its unit
    scale: float = 1.0


@dataclass
class Figure:
    name: str
    title: str
    x_label: str
    panels: list[str]
    metrics: list[Metric]
    points: list[Point] = field(default_factory=list)
    reference: str = ""  # file under scripts/smartrs/reference/
    ref_scale: float = 1.0  # the reference's unit in the first metric's (scaled) unit
    log_x: bool = False
    x_key: str = ""  # plot against this record field (scaled by x_scale) instead of the swept value
    x_scale: float = 1.0
    distribution: str = ""  # a record field of ops by retries: drawn as bars at the largest x


def sweep(mode: str, quick: list, full: list, cap: int | None = None) -> list:
    v = quick if mode == "quick" else full
    return [x for x in v if cap is None or x <= cap] or v[:1]


def ycsb(workload: str, smart: str, threads: int, keys: int, app: str = "race", extra: list[str] | None = None):
    return ["ycsb", "--app", app, "--workload", workload, "--keys", str(keys), "--threads", str(threads),
            "--coroutines", "8", "--smart", smart] + (extra or [])


def build(name: str, mode: str, max_threads: int, memory_blades: int = 2, sim: bool = False) -> Figure:
    """The sweep of figure `name` in `mode` (quick or full); `sim`: on the
    simulated cluster, at the paper's thread counts."""
    if sim:
        threads = sweep(mode, [1, 8, 24, 48, 96], [1, 8, 16, 24, 32, 48, 64, 72, 96])
        keys = 100_000 if mode == "quick" else 1_000_000
    else:
        threads = sweep(mode, [1, 2], [1, 2, 4, 8, 16, 24, 32, 48, 64, 96], max_threads)
        keys = 20_000 if mode == "quick" else 1_000_000
    tmax = threads[-1]

    def depth(d: int) -> list[str]:
        # The artifact's test_rdma posts D WRs (a doorbell each), then waits
        # for all; the simulated runs do the same (--depth), the real quick
        # runs keep D coroutines per thread.
        return ["--coroutines", "1", "--depth", str(d)] if sim else ["--coroutines", str(d)]
    if name in ("3a", "3b"):
        op = "read" if name == "3a" else "write"
        f = Figure(name, f"8-byte RDMA {op.upper()}, depth 8, by QP policy", "threads", [op],
                   [Metric("throughput_mops", "throughput (Mop/s)")], reference=f"fig{name}.csv")
        for policy, label in [("shared", "shared QP"), ("multiplexed:4", "multiplexed QP (4 thr/QP)"),
                              ("multiplexed:2", "multiplexed QP (2 thr/QP)"), ("per-thread-qp", "per-thread QP"),
                              ("per-thread-db", "per-thread doorbell")]:
            for t in threads:
                f.points.append(Point(op, label, t, ["micro", "--op", op, "--size", "8", "--threads", str(t)]
                                      + depth(8) + ["--smart", "none", "--qp-policy", policy]))
        return f
    if name == "4":
        f = Figure("4", "8-byte READ, per-thread doorbell, by outstanding WRs per thread", "threads", ["read"],
                   [Metric("throughput_mops", "throughput (Mop/s)")], reference="fig4.csv")
        for d in sweep(mode, [1, 8, 32], [1, 2, 4, 8, 16, 32, 64, 128]):
            for t in threads:
                f.points.append(Point("read", f"depth {d}", t,
                                      ["micro", "--op", "read", "--size", "8", "--threads", str(t)] + depth(d)
                                      + ["--smart", "none", "--qp-policy", "per-thread-db"]))
        return f
    if name == "5":
        f = Figure("5", "RACE, update-only (Zipf 0.99): throughput and retries as threads grow", "threads",
                   ["update-only"], [Metric("throughput_mops", "throughput (Mop/s)"),
                                     Metric("retries_per_op", "retries per operation")], reference="fig5.csv")
        for smart, label in [(RACE, "RACE"), (SMART_HT, "Smart-HT")]:
            for t in threads:
                f.points.append(Point("update-only", label, t, ycsb("update-only", smart, t, keys), table=True))
        return f
    if name == "7":
        procs = sweep(mode, [1, 2], [1, 2, 3, 4, 5, 6])
        f = Figure("7", "RACE vs Smart-HT, scale-out over compute blades (Zipf 0.99)", "compute blades",
                   ["a", "b", "c"], [Metric("throughput_mops", "throughput (Mop/s)")], reference="fig7.csv")
        for w in ("a", "b", "c"):
            for smart, label in [(RACE, "RACE"), (SMART_HT, "Smart-HT")]:
                for k in procs:
                    f.points.append(Point(w, label, k, ycsb(w, smart, tmax, keys), processes=k, table=True))
        return f
    if name == "8":
        f = Figure("8", "Breakdown of Smart-HT's techniques, YCSB (Zipf 0.99)", "threads", ["a", "b", "c"],
                   [Metric("throughput_mops", "throughput (Mop/s)")], reference="fig8.csv")
        for smart, label in [(RACE, "RACE"), ("thd-res-alloc", "+ThdResAlloc"),
                             ("thd-res-alloc,work-req-throt", "+WorkReqThrot"), (SMART_HT, "Smart-HT")]:
            for w in ("a", "b", "c"):
                for t in threads:
                    f.points.append(Point(w, label, t, ycsb(w, smart, t, keys), table=True))
        return f
    if name in ("9", "11"):
        idles = sweep(mode, [0, 64, 512], [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192])
        lat = [Metric("latency_us.p50", "median latency (µs)"), Metric("latency_us.p99", "p99 latency (µs)")]
        if name == "9":
            f = Figure("9", f"Latency vs throughput, YCSB C (Zipf 0.99), {tmax} threads, idle 0–{idles[-1]} µs per op",
                       "throughput (Mop/s)", ["c"], lat, x_key="throughput_mops", reference="fig9.csv")
            for smart, label in [(RACE, "RACE"), (SMART_HT, "Smart-HT")]:
                for i in idles:
                    f.points.append(Point("c", label, i, ycsb("c", smart, tmax, keys, extra=["--idle-us", str(i)]),
                                          table=True))
            return f
        replicas = min(2, memory_blades)
        f = Figure("11", f"Latency vs throughput, {tmax} threads, idle 0–{idles[-1]} µs per transaction",
                   "committed (ktxn/s)", ["smallbank", "tatp"], lat, x_key="committed_per_s", x_scale=1e-3,
                   reference="fig11.csv")
        n = "20000" if mode == "quick" else "1000000"
        for smart, label in [("none", "FORD+"), ("all", "Smart-DTX")]:
            for w, size in (("smallbank", ["--accounts", n]), ("tatp", ["--subscribers", n])):
                for i in idles:
                    f.points.append(Point(w, label, i, [w, "--threads", str(tmax), "--coroutines", "8", "--smart", smart,
                                                        "--replicas", str(replicas), "--idle-us", str(i)] + size,
                                          fresh_blades=True))
        return f
    if name == "10":
        replicas = min(2, memory_blades)
        f = Figure("10", f"FORD+ vs Smart-DTX ({replicas} replica{'s' if replicas > 1 else ''})", "threads",
                   ["smallbank", "tatp"],
                   [Metric("committed_per_s", "committed (ktxn/s)", 1e-3), Metric("latency_us.p99", "p99 latency (µs)"),
                    Metric("abort_rate", "abort rate")], reference="fig10.csv", ref_scale=1e3)
        size = ["--accounts", "20000"] if mode == "quick" else ["--accounts", "1000000"]
        tsize = ["--subscribers", "20000"] if mode == "quick" else ["--subscribers", "1000000"]
        for smart, label in [("none", "FORD+"), ("all", "Smart-DTX")]:
            for t in threads:
                for w, s in (("smallbank", size), ("tatp", tsize)):
                    f.points.append(Point(w, label, t, [w, "--threads", str(t), "--coroutines", "8", "--smart", smart,
                                                        "--replicas", str(replicas)] + s, fresh_blades=True))
        return f
    if name == "12":
        f = Figure("12", "Sherman+ vs Smart-BT (speculative lookup), YCSB (Zipf 0.99)", "threads", ["a", "b", "c"],
                   [Metric("throughput_mops", "throughput (Mop/s)")], reference="fig12.csv")
        for smart, label in [(SHERMAN_PLUS, "Sherman+"), (SMART_BT, "Smart-BT")]:
            for w in ("a", "b", "c"):
                for t in threads:
                    f.points.append(Point(w, label, t, ycsb(w, smart, t, keys, app="sherman"), fresh_blades=True))
        return f
    if name == "12df":
        procs = sweep(mode, [1, 2], [1, 2, 3, 4, 5, 6, 7, 8])
        f = Figure("12df", "Sherman+ vs Smart-BT, scale-out over compute blades (Zipf 0.99)", "compute blades",
                   ["a", "b", "c"], [Metric("throughput_mops", "throughput (Mop/s)")], reference="fig12df.csv")
        for smart, label in [(SHERMAN_PLUS, "Sherman+"), (SMART_BT, "Smart-BT")]:
            for w in ("a", "b", "c"):
                for k in procs:
                    f.points.append(Point(w, label, k, ycsb(w, smart, tmax, keys, app="sherman"), processes=k,
                                          fresh_blades=True, table=True))
        return f
    if name in ("13a", "13b"):
        series = [("none", "per-thread QP"), ("thd-res-alloc", "+ThdResAlloc"),
                  ("thd-res-alloc,work-req-throt", "+WorkReqThrot")]
        if name == "13a":
            f = Figure("13a", "8-byte READ at depth 16: WorkReqThrot as threads grow", "threads", ["read"],
                       [Metric("throughput_mops", "throughput (Mop/s)")], reference="fig13a.csv")
            xs = [(t, t, 16) for t in threads]
        else:
            f = Figure("13b", f"8-byte READ at {tmax} threads: WorkReqThrot as depth grows", "outstanding WRs per thread",
                       ["read"], [Metric("throughput_mops", "throughput (Mop/s)")], log_x=True,
                       reference="fig13b.csv")
            xs = [(d, tmax, d) for d in sweep(mode, [1, 8, 32], [1, 2, 4, 8, 16, 32])]
        for smart, label in series:
            for x, t, d in xs:
                f.points.append(Point("read", label, x, ["micro", "--op", "read", "--size", "8", "--threads", str(t)]
                                      + depth(d) + ["--smart", smart]))
        return f
    if name == "table1":
        f = Figure("table1", f"8-byte READ at {tmax} threads, depth 64, active threads redrawn every phase "
                   "(37.5–100% of them): the tuner under a changing workload", "phase length (ms)", ["read"],
                   [Metric("throughput_mops", "throughput (Mop/s)"),
                    Metric("mean:smart_state.credit_limit", "credit limit at the end (mean over threads)")],
                   log_x=True, reference="table1.csv")
        for smart, label in [("thd-res-alloc", "per-thread doorbell"), ("thd-res-alloc,work-req-throt", "+WorkReqThrot")]:
            # The artifact's phases: 8 to 2048 ms.
            for ms in (sweep(mode, [1, 4], [1, 2, 4, 8]) if sim else
                       sweep(mode, [20, 200], [8, 16, 32, 64, 128, 256, 512, 1024, 2048])):
                f.points.append(Point("read", label, ms, ["micro", "--op", "read", "--size", "8", "--threads", str(tmax),
                                                          "--coroutines", "64", "--smart", smart, "--phase-ms", str(ms)]))
        return f
    if name == "14":
        f = Figure("14", "RACE, update-only (Zipf 0.99), depth 8: the parts of ConflictAvoid as threads grow",
                   "threads", ["update-only"], [Metric("throughput_mops", "throughput (Mop/s)"),
                                                Metric("retries_per_op", "retries per operation")],
                   distribution="verbs.ops_by_retries", reference="fig14.csv")
        for parts, label in CONFLICT_STEPS:
            smart = SMART_HT if parts else "thd-res-alloc,work-req-throt"
            for t in threads:
                f.points.append(Point("update-only", label, t, ycsb("update-only", smart, t, keys, extra=(
                    ["--conflict-avoid-parts", parts] if parts else [])), table=True))
        return f
    if name == "14skew":
        f = Figure("14skew", f"RACE, update-only at {tmax} threads: retries with and without ConflictAvoid as skew grows",
                   "Zipfian skew", ["update-only"], [Metric("retries_per_op", "retries per operation"),
                                                     Metric("throughput_mops", "throughput (Mop/s)")],
                   distribution="verbs.ops_by_retries")
        for smart, label in [("thd-res-alloc,work-req-throt", "without ConflictAvoid"), (SMART_HT, "with ConflictAvoid")]:
            for z in sweep(mode, [0.5, 0.99], [0.5, 0.6, 0.7, 0.8, 0.9, 0.99, 1.1, 1.2]):
                f.points.append(Point("update-only", label, z,
                                      ycsb("update-only", smart, tmax, keys, extra=["--zipf", str(z)]), table=True))
        return f
    raise SystemExit(f"figure {name!r}: not one of {', '.join(FIGURES)} (or all)")


FIGURES = ["3a", "3b", "4", "5", "7", "8", "9", "10", "11", "12", "12df", "13a", "13b", "14", "14skew", "table1"]
ABSENT: dict[str, str] = {}
RETRY_BUCKETS = ["0", "1", "2", "3–4", "5–8", "9–16", "17–32", ">32"]


def get(rec: dict, key: str) -> float:
    if key.startswith("mean:"):
        # The mean of a field over a list (e.g. the threads' credit limits),
        # 0 when the technique is off (null).
        lst, field_ = key[5:].split(".", 1)
        vals = [x.get(field_) for x in rec.get(lst, []) if x.get(field_) is not None]
        return sum(vals) / len(vals) if vals else float("nan")
    v = rec
    for k in key.split("."):
        v = v[k]
    return float(v)


def record_commit(rec: dict) -> str:
    """The commit a record's binary was built from (a merged record's parts
    carry it)."""
    prov = rec.get("provenance") or (rec.get("parts") or [{}])[0].get("provenance", {})
    return str(prov.get("commit", ""))


def resumable(fig: Figure, mode: str, lines: list[str], commit: str) -> tuple[list[str], dict]:
    """Of a figure's JSON lines from an earlier, interrupted run: the ones
    `--resume` keeps (a planned point of this mode, recorded by a binary of
    `commit`, the first line of each point) and why the others go."""
    planned = {(p.panel, p.series, p.x) for p in fig.points}
    kept, seen = [], set()
    dropped = {"another mode": 0, "another commit": 0, "not in this sweep": 0, "unreadable": 0, "repeated": 0}
    for line in lines:
        try:
            row = json.loads(line)
            key = (row["panel"], row["series"], row["x"])
            rec = row["record"]
        except (ValueError, KeyError, TypeError):
            dropped["unreadable"] += 1
            continue
        why = ("another mode" if row.get("mode") != mode else "not in this sweep" if key not in planned
               else "another commit" if record_commit(rec) != commit else "repeated" if key in seen else None)
        if why:
            dropped[why] += 1
        else:
            seen.add(key)
            kept.append(line)
    return kept, {k: v for k, v in dropped.items() if v}


def built_commit() -> str:
    """The commit of this checkout's compute-blade (what its records say)."""
    v = subprocess.run([str(REPO / "target/release/compute-blade"), "--version"], capture_output=True, text=True)
    return version_commit(v.stdout)


def run_figure(fig: Figure, mode: str, launcher: Launcher, out: Path, resume: bool = False) -> Path:
    """Runs every point; appends one JSON line per run to fig<name>.jsonl.
    With `resume`, keeps the points an earlier run of this mode and build
    recorded there, and runs only the others."""
    secs, warm = (0.5, 0.2) if mode == "quick" else (10.0, 2.0)
    jl = out / f"fig{fig.name}.jsonl"
    done: set[tuple] = set()
    if resume and jl.exists():
        commit = built_commit()
        kept, dropped = resumable(fig, mode, jl.read_text().splitlines(), commit)
        jl.write_text("".join(line + "\n" for line in kept))
        done = {(r["panel"], r["series"], r["x"]) for r in map(json.loads, kept)}
        why = ", ".join(f"{n} {k}" for k, n in dropped.items())
        print(f"[fig {fig.name}] resuming: {len(done)} of {len(fig.points)} points already recorded by {commit[:10]}"
              + (f"; dropped: {why}" if why else ""), file=sys.stderr, flush=True)
    else:
        jl.unlink(missing_ok=True)
    blades = None
    t0 = time.monotonic()
    ran = 0
    for i, p in enumerate(fig.points):
        if (p.panel, p.series, p.x) in done:
            continue
        if blades is None or p.fresh_blades:
            if blades is not None:
                launcher.stop_blades()
            blades = launcher.start_blades()
        tag = f"fig{fig.name}-{i + 1}"
        args = list(p.args) + ["--duration", str(secs), "--warmup", str(warm)]
        load = None
        if p.table:
            args += ["--table", tag]
        if p.processes > 1:
            load = ["--load-only"]
            args += ["--no-load"]
        took = time.monotonic() - t0
        left = sum(1 for q in fig.points[i:] if (q.panel, q.series, q.x) not in done)
        eta = f", ~{took / ran * left:.0f}s left" if ran else ""
        ran += 1
        print(f"[fig {fig.name} {i + 1}/{len(fig.points)} {took:5.0f}s{eta}] {p.panel} {p.series} "
              f"x={p.x}: compute-blade {' '.join(p.args)}" + (f" ×{p.processes}" if p.processes > 1 else ""),
              file=sys.stderr, flush=True)
        rec = launcher.run_multi(blades, args, p.processes, out / "records" / f"{tag}.json", tag,
                                 timeout=120 + 4 * secs, load=load)
        if rec.get("errors", 0) or rec.get("violations", 0):
            raise LaunchError(f"{tag}: the run reported errors {rec.get('errors')} violations {rec.get('violations')} "
                              f"(record: {out / 'records' / (tag + '.json')})")
        with jl.open("a") as f:
            f.write(json.dumps({"figure": fig.name, "mode": mode, "panel": p.panel, "series": p.series, "x": p.x,
                                "x_label": fig.x_label, "processes": p.processes, "record": rec}) + "\n")
        if p.table and p.args[p.args.index("--app") + 1] == "race":
            # Hand the table's memory back for the next run.
            launcher.wait_all([launcher.compute(launcher.cluster.compute[0].host,
                                                ["table", "drop", tag, "--blades", blades] + launcher.link_flags()
                                                + ["--quiet"], name=f"{tag}-drop")], timeout=60)
    launcher.stop_blades()
    return jl


def sim_durations(fig: Figure, mode: str, args: list[str]) -> tuple[float, float]:
    """Virtual seconds measured and of warm-up, per simulated point."""
    smart = args[args.index("--smart") + 1] if "--smart" in args else "all"
    adaptive = smart == "all" or "work-req-throt" in smart or "conflict-avoid" in smart
    if fig.name == "table1":
        # Long enough for several phases of the longest.
        return (0.03, 0.002) if mode == "quick" else (0.08, 0.005)
    if adaptive:
        # WorkReqThrot's tuner measures limits for Δ = 8 ms each, halving
        # from the thread's bound (4096 WRs): its first update phase ends
        # after about 15 Δ. ConflictAvoid's controller judges its levels
        # over windows of 1 ms. Measure after both have settled.
        return (0.01, 0.13) if mode == "quick" else (0.05, 0.2)
    return (0.002, 0.0005) if mode == "quick" else (0.01, 0.002)


def run_figure_sim(fig: Figure, mode: str, out: Path, profile: str, jobs: int) -> Path:
    """Runs every point on the simulated cluster (`--transport sim`), `jobs`
    at a time; writes fig<name>.jsonl in the sweep's order."""
    import concurrent.futures

    jl = out / f"fig{fig.name}.jsonl"
    jl.unlink(missing_ok=True)
    binary = str(REPO / "target/release/compute-blade")
    t0 = time.monotonic()

    def one(i: int) -> dict:
        p = fig.points[i]
        tag = f"fig{fig.name}-{i + 1}"
        rec = out / "records" / f"{tag}.json"
        secs, warm = sim_durations(fig, mode, p.args)
        args = list(p.args) + ["--transport", "sim", "--sim-profile", profile, "--duration", str(secs), "--warmup",
                               str(warm), "--seed", "1", "--quiet", "--json", str(rec)]
        if p.processes > 1:
            args += ["--sim-compute-blades", str(p.processes)]
        if p.args[0] == "ycsb":
            args += ["--sim-memory-blades", "2"]
        r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=3600)
        log = out / "logs" / f"{tag}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ compute-blade {' '.join(args)}\n{r.stdout}{r.stderr}")
        if r.returncode != 0:
            raise LaunchError(f"{tag}: compute-blade {' '.join(args)} failed ({r.returncode}); log: {log}")
        v = json.loads(rec.read_text())
        if v.get("errors", 0) or v.get("violations", 0):
            raise LaunchError(f"{tag}: the run reported errors {v.get('errors')} violations {v.get('violations')} "
                              f"(record: {rec})")
        print(f"[fig {fig.name} sim {i + 1}/{len(fig.points)} {time.monotonic() - t0:5.0f}s] {p.panel} {p.series} "
              f"x={p.x}: {v['throughput_mops']:.3f} Mop/s, {v['sim']['verbs_per_wall_s'] / 1e6:.2f} M verbs/s wall",
              file=sys.stderr, flush=True)
        return {"figure": fig.name, "mode": mode, "panel": p.panel, "series": p.series, "x": p.x,
                "x_label": fig.x_label, "processes": p.processes, "record": v}

    with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
        rows = list(ex.map(one, range(len(fig.points))))
    with jl.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return jl


def short(commit: str) -> str:
    """A commit as a title shows it: 10 hex digits, and +dirty if so."""
    return commit[:10] + ("+dirty" if commit.endswith("+dirty") else "")


def xval(fig: Figure, row: dict) -> float:
    return get(row["record"], fig.x_key) * fig.x_scale if fig.x_key else row["x"]


def reference(fig: Figure) -> dict[tuple[str, str, str], list[tuple[float, float]]]:
    """The paper's curves for this figure: (metric key, panel, series) →
    [(x, y)]. A reference file without a `metric` column holds curves of
    the figure's first metric."""
    if not fig.reference:
        return {}
    p = Path(__file__).resolve().parent / "reference" / fig.reference
    curves: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    with p.open() as f:
        for row in csv.DictReader(line for line in f if not line.startswith("#")):
            key = (row.get("metric") or fig.metrics[0].key, row["panel"], row["series"])
            curves.setdefault(key, []).append((float(row["x"]), float(row["y"])))
    return curves


def plot(fig: Figure, jl: Path, out: Path) -> list[Path]:
    """Draws fig<name>.png and .pdf from the JSON lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = [json.loads(line) for line in jl.read_text().splitlines() if line.strip()]
    if not rows:
        raise LaunchError(f"{jl}: no runs to plot")
    ref = reference(fig)
    simulated = rows[0]["record"].get("transport") == "sim"
    # A row of the paper's curves under ours for each metric they give.
    ref_metrics = [m for m in fig.metrics if any(k[0] == m.key for k in ref)]
    nrows = len(fig.metrics) + len(ref_metrics)
    ncols = len(fig.panels) + (1 if fig.distribution else 0)
    fig_, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows), squeeze=False)
    series = list(dict.fromkeys(r["series"] for r in rows))
    colors = {s: f"C{i}" for i, s in enumerate(series)}
    for c, panel in enumerate(fig.panels):
        for r_i, m in enumerate(fig.metrics):
            ax = axes[r_i][c]
            for s in series:
                # In the order of the swept value (for a latency–throughput
                # curve, the idle time), plotted against xval.
                pts = [(xval(fig, r), get(r["record"], m.key) * m.scale)
                       for r in sorted(rows, key=lambda r: r["x"]) if r["panel"] == panel and r["series"] == s]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=s, color=colors[s])
            ax.set_xlabel(fig.x_label)
            ax.set_ylabel(m.label)
            if not fig.x_key and all(float(r["x"]).is_integer() for r in rows):
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if fig.log_x:
                ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            if len(fig.panels) > 1:
                ax.set_title(panel_title(panel))
        for r_i, m in enumerate(ref_metrics, start=len(fig.metrics)):
            ax = axes[r_i][c]
            if not any(k[:2] == (m.key, panel) for k in ref):
                ax.axis("off")
                ax.text(0.5, 0.5, "no reference result\nfor this panel", ha="center", va="center")
                continue
            if not fig.x_key:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if fig.log_x:
                ax.set_xscale("log", base=2)
            curves = {}
            for s in series:
                mine = [r for r in sorted(rows, key=lambda r: r["x"]) if r["panel"] == panel and r["series"] == s]
                ours = [(xval(fig, r), get(r["record"], m.key)) for r in mine]
                theirs = list(ref.get((m.key, panel, s), []))
                if not fig.x_key:
                    ours, theirs = sorted(ours), sorted(theirs)
                curves[s] = (ours, theirs)
            if simulated and not fig.x_key:
                # The simulated cluster models the paper's hardware: the
                # paper's numbers beside ours as they are.
                for s, (ours, theirs) in curves.items():
                    if ours:
                        ax.plot(*zip(*[(x, y * m.scale) for x, y in ours]), "-", color=colors[s], marker="o",
                                label=f"{s} (simulated)")
                    if theirs:
                        ax.plot(*zip(*[(x, y * fig.ref_scale) for x, y in theirs]), "--", color=colors[s],
                                label=f"{s} (paper)")
                ax.set_xlabel(fig.x_label)
                ax.set_ylabel(m.label)
                ax.set_ylim(bottom=0)
                ax.set_title("simulated (solid) vs paper's hardware (dashed)", fontsize=9)
                ax.grid(alpha=0.3)
                continue
            # Against the swept value, each side (ours, the paper's) is
            # normalised to its largest value in the panel, so the series
            # keep their order and distances; a latency–throughput curve
            # (x_key) to its own maxima on both axes.
            tops = [max((y for c in curves.values() for _, y in c[i]), default=0) for i in (0, 1)]
            for s, sides in curves.items():
                for i, (pts, style, who) in enumerate(((sides[0], "-", "ours"), (sides[1], "--", "paper"))):
                    top = max((y for _, y in pts), default=0) if fig.x_key else tops[i]
                    right = max((x for x, _ in pts), default=0) if fig.x_key else 1
                    if pts and top > 0 and right > 0:
                        ax.plot([x / right for x, _ in pts], [y / top for _, y in pts], style, color=colors[s],
                                marker="o" if who == "ours" else None, label=f"{s} ({who})")
            ax.set_xlabel(f"{fig.x_label}, normalised" if fig.x_key else fig.x_label)
            what = m.label.split(" (")[0]
            ax.set_ylabel(f"{what},\nnormalised" if fig.x_key else f"{what},\n÷ the panel's largest")
            ax.set_title("shape: ours (solid) vs paper (dashed)", fontsize=9)
            ax.grid(alpha=0.3)
    if fig.distribution:
        # The distribution of retries per operation at the largest x, one
        # bar group per bucket; the rows below it stay empty.
        ax = axes[0][-1]
        top = max(r["x"] for r in rows)
        width = 0.8 / max(len(series), 1)
        for i, s in enumerate(series):
            r = next((r for r in rows if r["series"] == s and r["x"] == top), None)
            if r is None:
                continue
            v = r["record"]
            for k in fig.distribution.split("."):
                v = v[k]
            total = sum(v) or 1
            ax.bar([b + i * width for b in range(len(v))], [c / total for c in v], width, color=colors[s], label=s)
        ax.set_xticks([b + 0.4 - width / 2 for b in range(len(RETRY_BUCKETS))], RETRY_BUCKETS, fontsize=8)
        ax.set_xlabel(f"retries of an operation (at {fig.x_label} {top})")
        ax.set_ylabel("share of operations")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        for r_i in range(1, nrows):
            axes[r_i][-1].axis("off")
    axes[0][0].legend(fontsize=8)
    rec0 = rows[0]["record"]
    prov = rec0.get("provenance") or (rec0.get("parts") or [{}])[0].get("provenance", {})
    title = textwrap.fill(f"Figure {fig.name}: {fig.title}", width=48 * ncols)
    if simulated:
        sim = rec0.get("sim", {})
        title = f"SIMULATED — {title}"
        how = (f"{rows[0]['mode']} run on smart-sim (profile {sim.get('profile', '?')}, virtual time): "
               f"simulated, not measured on hardware; commit {short(str(prov.get('commit', '?')))}")
    else:
        how = (f"{rows[0]['mode']} run, {rec0.get('transport')} transport, "
               f"commit {short(str(prov.get('commit', '?')))}, host {prov.get('host', '?')}")
    fig_.suptitle(f"{title}\n{how}", fontsize=10)
    fig_.tight_layout()
    made = []
    for ext in ("png", "pdf"):
        p = out / f"fig{fig.name}.{ext}"
        fig_.savefig(p, dpi=110)
        made.append(p)
    plt.close(fig_)
    return made


def panel_title(panel: str) -> str:
    """What a panel shows: a one-letter panel is a YCSB workload."""
    return f"YCSB {panel.upper()}" if len(panel) == 1 else panel


def table(fig: Figure, jl: Path, out: Path) -> Path:
    """The figure's numbers as a Markdown table (one row per x, a column per
    series and metric): the paper's table 1 is a table."""
    rows = [json.loads(line) for line in jl.read_text().splitlines() if line.strip()]
    series = list(dict.fromkeys(r["series"] for r in rows))
    panels = list(dict.fromkeys(r["panel"] for r in rows))
    cols = [(s, m) for m in fig.metrics for s in series]
    lines = []
    for panel in panels:
        # One table per panel, labelled when there are several.
        if len(panels) > 1:
            lines += ["", f"**({panel}) {panel_title(panel)}**" if len(panel) == 1 else f"**{panel}**", ""]
        lines += [f"| {fig.x_label} | " + " | ".join(f"{s}: {m.label}" for s, m in cols) + " |",
                  "|---" * (len(cols) + 1) + "|"]
        for x in sorted({r["x"] for r in rows if r["panel"] == panel}):
            cells = []
            for s, m in cols:
                r = next((r for r in rows if r["x"] == x and r["series"] == s and r["panel"] == panel), None)
                v = get(r["record"], m.key) * m.scale if r else None
                cells.append("–" if v is None else "off" if v != v else f"{v:.3f}")
            lines.append(f"| {x:g} | " + " | ".join(cells) + " |")
    title = fig.title
    if rows[0]["record"].get("transport") == "sim":
        prof = rows[0]["record"].get("sim", {}).get("profile", "?")
        title = f"SIMULATED (smart-sim, profile {prof}; not measured on hardware): {title}"
    p = out / f"fig{fig.name}.md"
    p.write_text(f"{title}\n\n" + "\n".join(lines).lstrip("\n") + "\n")
    return p


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/figure", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("figures", nargs="+", help=f"{', '.join(FIGURES)} or all")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", dest="mode", const="quick",
                      help="a few points, under a second each (the default)")
    mode.add_argument("--full", action="store_const", dest="mode", const="full", help="the paper's sweep")
    ap.add_argument("--cluster", help="cluster file (default: scripts/cluster.localhost.toml)")
    ap.add_argument("--out", default=str(REPO / "results" / "figures"), help="output directory")
    ap.add_argument("--plot-only", action="store_true", help="redraw from the existing JSON lines")
    ap.add_argument("--no-plot", action="store_true", help="run and record only")
    ap.add_argument("--resume", action="store_true",
                    help="keep the points an interrupted run of this mode and build recorded; run the rest")
    ap.add_argument("--sim", action="store_true",
                    help="on the simulated cluster (--transport sim), at the paper's thread counts, in virtual time")
    ap.add_argument("--sim-profile", default="connectx6", help="the simulation's hardware profile (name or TOML file)")
    ap.add_argument("--jobs", type=int, default=2, help="simulated points run at once (with --sim)")
    a = ap.parse_args(argv)
    a.mode = a.mode or "quick"
    if a.sim and (a.cluster or a.resume):
        print("scripts/figure: --sim runs on this machine's simulated cluster: no --cluster or --resume",
              file=sys.stderr)
        return 2
    if a.jobs < 1:
        print("scripts/figure: --jobs must be at least 1", file=sys.stderr)
        return 2
    if a.sim and a.out == str(REPO / "results" / "figures"):
        a.out = str(REPO / "results" / "figures-sim")
    names = FIGURES if a.figures == ["all"] else a.figures
    for n in names:
        if n in ABSENT:
            print(f"figure {n}: {ABSENT[n]}", file=sys.stderr)
            return 2
        if n not in FIGURES:
            print(f"figure {n!r}: not one of {', '.join(FIGURES)} (or all)", file=sys.stderr)
            return 2
    out = Path(a.out)
    (out / "records").mkdir(parents=True, exist_ok=True)
    try:
        cluster = load_cluster(a.cluster)
    except (LaunchError, OSError) as e:
        print(f"scripts/figure: {e}", file=sys.stderr)
        return 2

    def body() -> int:
        if a.sim:
            for n in names:
                fig = build(n, a.mode, 96, 2, sim=True)
                jl = out / f"fig{n}.jsonl"
                if not a.plot_only:
                    jl = run_figure_sim(fig, a.mode, out, a.sim_profile, a.jobs)
                if not a.no_plot:
                    for p in plot(fig, jl, out) + [table(fig, jl, out)]:
                        print(f"figure {n}: {p}")
            return 0
        with Launcher(cluster, out / "logs") as launcher:
            for n in names:
                fig = build(n, a.mode, cluster.max_threads(), len(cluster.memory))
                jl = out / f"fig{n}.jsonl"
                if not a.plot_only:
                    jl = run_figure(fig, a.mode, launcher, out, resume=a.resume)
                if not a.no_plot:
                    for p in plot(fig, jl, out) + [table(fig, jl, out)]:
                        print(f"figure {n}: {p}")
        return 0

    return guarded("scripts/figure", out / "logs", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
