"""`scripts/cluster`: pre-flight checks and one run over the machines of a
cluster file.

    scripts/cluster preflight [--cluster FILE]
    scripts/cluster run [--cluster FILE] [--processes N] [--out DIR] -- \\
        ycsb --workload c --keys 1000000 --threads 8

`run` starts the memory blades and waits for each `ready` line; for ycsb
one process loads the table (`--load-only`); then N compute blades, spread
over the compute hosts, attach (`--no-load`) and meet at a `--barrier` so
that their timed phases start together; their records are merged into
DIR/merged.json (ops summed, latency percentiles from the merged
histograms). On failure, time-out or Ctrl-C every process is stopped and
every log kept in DIR/logs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster import REPO, LaunchError, Launcher, guarded, load_cluster, preflight  # noqa: E402


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pf = sub.add_parser("preflight", help="check every host before a run")
    pf.add_argument("--cluster")
    r = sub.add_parser("run", help="one run: memory blades, a loader, N compute blades, the merged record")
    r.add_argument("--cluster")
    r.add_argument("--processes", type=int, default=0, help="compute blades (default: one per compute host)")
    r.add_argument("--out", default=str(REPO / "results" / "cluster" / time.strftime("%Y%m%d-%H%M%S")))
    r.add_argument("--timeout", type=float, default=0, help="seconds for the whole run (default: duration + 300)")
    r.add_argument("args", nargs=argparse.REMAINDER, help="-- then the compute-blade subcommand and its flags")
    a = ap.parse_args(argv)
    try:
        cluster = load_cluster(a.cluster)
    except (LaunchError, OSError) as e:
        print(f"scripts/cluster: {e}", file=sys.stderr)
        return 2
    if a.cmd == "preflight":
        problems = preflight(cluster)
        logs = Path(tempfile.gettempdir()) / f"smart-rs-preflight-{time.time_ns()}"
        if not problems:
            try:
                # Starting the blades checks that every compute host reaches them.
                with Launcher(cluster, logs) as launcher:
                    launcher.cpus_checked = True  # just above
                    launcher.start_blades()
            except LaunchError as e:
                problems = [str(e)]
        for p in problems:
            print(f"preflight: {p}", file=sys.stderr)
        if problems:
            if logs.exists():
                print(f"preflight: the blades' logs are in {logs}", file=sys.stderr)
            return 1
        # Nothing to look at when every blade started: leave no directory behind.
        shutil.rmtree(logs, ignore_errors=True)
        print(f"preflight: ok ({len(cluster.memory)} memory blades, {len(cluster.compute)} compute hosts, "
              f"transport {cluster.transport})")
        return 0
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if not args:
        print("scripts/cluster run: give the compute-blade subcommand after --", file=sys.stderr)
        return 2
    for owned in ("--blades", "--json", "--barrier", "--transport"):
        if owned in args:
            print(f"scripts/cluster run: {owned} is set by the launcher from the cluster file", file=sys.stderr)
            return 2
    n = a.processes or len(cluster.compute)
    try:
        dur = float(args[args.index("--duration") + 1]) if "--duration" in args else 5.0
        threads = int(args[args.index("--threads") + 1]) if "--threads" in args else None
    except (IndexError, ValueError):
        print("scripts/cluster run: --duration and --threads take a number", file=sys.stderr)
        return 2
    timeout = a.timeout or dur + 300
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    def body() -> int:
        with Launcher(cluster, out / "logs") as launcher:
            launcher.threads = threads
            blades = launcher.start_blades()
            print(f"cluster: memory blades ready at {blades}", file=sys.stderr)
            load = ["--load-only"] if args[0] == "ycsb" and n > 1 and "--no-load" not in args else None
            run_args = args + (["--no-load"] if load else [])
            rec = launcher.run_multi(blades, run_args, n, out / "merged.json", "run", timeout, load=load)
        lat = rec.get("latency_us", {})
        print(f"{rec.get('processes', 1)} compute blades: {rec['throughput_mops']:.3f} Mop/s, {rec['ops']} ops, "
              f"p50 {lat.get('p50', 0):.1f} µs p99 {lat.get('p99', 0):.1f} µs, errors {rec.get('errors')} "
              f"-> {out / 'merged.json'}")
        return 0 if not rec.get("errors") else 1

    return guarded("scripts/cluster", out / "logs", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
