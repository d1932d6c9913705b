"""Unit tests of the cluster file and the command lines the launcher builds
(`python3 -m unittest discover -s scripts/smartrs -p 'test_*.py'`).

Both remote paths also run for real in scripts/test-cluster.sh: over a
real sshd (`--launch ssh`) and on a one-node Slurm cluster (`--launch srun`).
"""

import contextlib
import json
import io
import os
import shlex
import tempfile
import unittest
from pathlib import Path

import cluster
from cluster import LaunchError, Launcher, cpu_problems, load_cluster
import figures


_made: list[Path] = []


def cluster_file(text: str) -> Path:
    f = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    f.write(text)
    f.close()
    _made.append(Path(f.name))
    return Path(f.name)


def tearDownModule():
    for p in _made:
        p.unlink(missing_ok=True)


class ClusterFile(unittest.TestCase):
    def test_the_default_is_one_local_blade_over_tcp(self):
        c = load_cluster(None)
        self.assertEqual(c.transport, "tcp")
        self.assertEqual([m.host.launch for m in c.memory], ["local", "local"])
        self.assertEqual(len(c.sha256), 64)

    def test_remote_hosts_go_over_ssh_and_need_a_fixed_port(self):
        p = cluster_file('[[memory_blade]]\nhost = "node1"\nsize = "1GiB"\n')
        with self.assertRaisesRegex(LaunchError, "fixed port"):
            load_cluster(p)
        p = cluster_file('[defaults]\nworkdir = "/srv/smart"\nssh_port = 2222\n'
                         '[[memory_blade]]\nhost = "node1"\nport = 7000\n[[compute_blade]]\nhost = "node2"\nthreads = 8\n')
        c = load_cluster(p)
        h = c.memory[0].host
        self.assertEqual(h.launch, "ssh")
        argv = h.wrap(["/srv/smart/target/release/memory-blade", "--listen", "0.0.0.0:7000"], {"A": "b c"})
        self.assertEqual(argv[0], "ssh")
        for o in ("BatchMode=yes", "ControlMaster=auto", "ControlPersist=60"):
            self.assertIn(o, argv)
        self.assertEqual(argv[argv.index("-p") + 1], "2222")
        self.assertEqual(argv[-2], "node1")
        remote = shlex.split(argv[-1])
        self.assertEqual(remote[:2], ["sh", "-c"])
        self.assertTrue(remote[2].startswith(
            "cd /srv/smart && echo pid $$; export A='b c'; exec /srv/smart/target/release/memory-blade"), remote)
        self.assertEqual(c.max_threads(), 8)

    def test_bad_files_are_refused_naming_the_problem(self):
        for text, what in [("[[memory_blade]\n", "not valid TOML"), ("[defaults]\n", "no \\[\\[memory_blade\\]\\]"),
                           ('[defaults]\ntransport = "ib"\n[[memory_blade]]\n', "transport must be"),
                           ('[[memory_blade]]\nlaunch = "pdsh"\n', "launch must be"),
                           ('[[memory_blade]]\n[[compute_blade]]\nthreads = 0\n', "threads must be"),
                           ('[[memory_blade]]\n[nodes]\n', "unknown section"),
                           ('[[memory_blade]]\nadress = "10.0.0.1"\n', "memory_blade 1: unknown field\\(s\\) adress"),
                           ('[[memory_blade]]\n[[compute_blade]]\nthread = 8\n', "compute_blade 1: unknown field"),
                           ('[defaults]\ntransprot = "tcp"\n[[memory_blade]]\n', "\\[defaults\\]: unknown field"),
                           ('[[memory_blade]]\ndurable = "yes"\n', "true or false"),
                           ('[[memory_blade]]\n[[compute_blade]]\noversubscribe = 1\n', "true or false"),
                           ('[[memory_blade]]\ndurable = true\n', "needs a backing_file"),
                           ('[defaults]\ntransport = "verbs"\n[[memory_blade]]\nbacking_file = "/b"\ndurable = true\n',
                            "tcp only")]:
            with self.assertRaisesRegex(LaunchError, what):
                load_cluster(cluster_file(text))

    def test_a_durable_blade_gets_its_file_and_the_flag(self):
        c = load_cluster(cluster_file('[[memory_blade]]\nbacking_file = "/data/b.img"\ndurable = true\n'
                                      '[[memory_blade]]\n'))
        with tempfile.TemporaryDirectory() as logs, Launcher(c, Path(logs)) as launcher:
            first = launcher.memory_argv(c.memory[0], "127.0.0.1:0")
            second = launcher.memory_argv(c.memory[1], "127.0.0.1:0")
        self.assertEqual(first[-3:], ["--backing-file", "/data/b.img", "--durable"])
        self.assertNotIn("--durable", second)

    def test_a_cluster_secret_goes_to_every_blade_and_compute_blade(self):
        c = load_cluster(cluster_file('[defaults]\nsecret_file = "/etc/smart/cluster.secret"\n[[memory_blade]]\n'))
        with tempfile.TemporaryDirectory() as logs, Launcher(c, Path(logs)) as launcher:
            blade = launcher.memory_argv(c.memory[0], "127.0.0.1:0")
            link = launcher.link_flags()
        for argv in (blade, link):
            self.assertEqual(argv[argv.index("--secret-file") + 1], "/etc/smart/cluster.secret")
        with tempfile.TemporaryDirectory() as logs, Launcher(load_cluster(None), Path(logs)) as launcher:
            self.assertNotIn("--secret-file", launcher.link_flags())
        with self.assertRaisesRegex(LaunchError, "secret_file is a path"):
            load_cluster(cluster_file('[defaults]\nsecret_file = 1\n[[memory_blade]]\n'))

    def test_a_coordinator_goes_to_the_ford_runs_only(self):
        c = load_cluster(cluster_file('[defaults]\ncoordinator = "http://10.0.0.5:2379/lab"\n[[memory_blade]]\n'))
        with tempfile.TemporaryDirectory() as logs, Launcher(c, Path(logs)) as launcher:
            self.assertEqual(launcher.coordinator_flags(["smallbank", "--accounts", "10"]),
                             ["--coordinator", "http://10.0.0.5:2379/lab"])
            self.assertEqual(launcher.coordinator_flags(["ycsb"]), [])
        with tempfile.TemporaryDirectory() as logs, Launcher(load_cluster(None), Path(logs)) as launcher:
            self.assertEqual(launcher.coordinator_flags(["tatp"]), [])
        with self.assertRaisesRegex(LaunchError, "coordinator is etcd's URL"):
            load_cluster(cluster_file('[defaults]\ncoordinator = "10.0.0.5:2379"\n[[memory_blade]]\n'))

    def test_compute_blades_reach_a_blade_where_it_listens(self):
        text = ('[defaults]\nworkdir = "/w"\n'
                '[[memory_blade]]\nhost = "node1"\nport = 7000\n'
                '[[memory_blade]]\nhost = "node2"\nport = 7000\nlisten = "10.0.0.2"\n'
                '[[memory_blade]]\nhost = "node3"\nport = 7000\nlisten = "0.0.0.0"\naddress = "node3-ib"\n'
                '[[memory_blade]]\nhost = "node4"\nport = 7000\nlisten = "fd00::4"\n'
                '[[memory_blade]]\nport = 0\n')
        m = load_cluster(cluster_file(text)).memory
        self.assertEqual([b.listen_on() for b in m],
                         ["0.0.0.0:7000", "10.0.0.2:7000", "0.0.0.0:7000", "[fd00::4]:7000", "127.0.0.1:0"])
        self.assertEqual([b.reach() for b in m], ["node1", "10.0.0.2", "node3-ib", "[fd00::4]", "127.0.0.1"])

    def test_srun_needs_an_allocation_and_builds_an_overlapping_one_node_step(self):
        text = '[defaults]\nlaunch = "srun"\nworkdir = "/w"\n[[memory_blade]]\nhost = "cn01"\nport = 7000\n'
        os.environ.pop("SLURM_JOB_ID", None)
        with self.assertRaisesRegex(LaunchError, "Slurm allocation"):
            load_cluster(cluster_file(text))
        os.environ["SLURM_JOB_ID"] = "42"
        try:
            h = load_cluster(cluster_file(text)).memory[0].host
        finally:
            del os.environ["SLURM_JOB_ID"]
        argv = h.wrap(["/w/target/release/memory-blade", "--listen", "0.0.0.0:7000"], {})
        self.assertEqual(argv[:5], ["srun", "--nodes=1", "--ntasks=1", "--overlap", "--nodelist=cn01"])
        self.assertEqual(argv[5:7], ["sh", "-c"])
        self.assertTrue(argv[7].startswith("cd /w && echo pid $$; exec /w/target/release/memory-blade"))


class Cpus(unittest.TestCase):
    def test_threads_beyond_a_process_cpus_are_refused_unless_oversubscribed(self):
        text = ('[[memory_blade]]\n[[compute_blade]]\nthreads = 4\n'
                '[[compute_blade]]\nhost = "127.0.0.1"\nthreads = 2\n')
        c = load_cluster(cluster_file(text))
        real = cluster.cpus_of_a_process
        cluster.cpus_of_a_process = lambda h: 2
        try:
            problems = cpu_problems(c)
            self.assertEqual(len(problems), 1, problems)
            self.assertRegex(problems[0], "compute blade 1 on localhost: 4 threads, but .* gets 2 CPUs")
            self.assertEqual(cpu_problems(c, threads=2), [])
            self.assertEqual(len(cpu_problems(c, threads=3)), 2)
            over = load_cluster(cluster_file('[defaults]\noversubscribe = true\n' + text))
            self.assertEqual(cpu_problems(over), [])
        finally:
            cluster.cpus_of_a_process = real

    def test_compute_blades_sharing_a_host_beyond_its_cpus_are_noted_once(self):
        c = load_cluster(cluster_file('[[memory_blade]]\n[[compute_blade]]\nthreads = 2\n'))
        with tempfile.TemporaryDirectory() as logs, Launcher(c, Path(logs)) as launcher:
            launcher.cpus = {("local", "localhost"): 4}
            h = c.compute[0].host
            said = io.StringIO()
            with contextlib.redirect_stderr(said):
                launcher.note_shared_hosts([h, h], ["ycsb", "--threads", "2"])  # 4 threads, 4 CPUs
                launcher.note_shared_hosts([h, h, h], ["ycsb", "--threads", "2"])
                launcher.note_shared_hosts([h, h, h], ["ycsb", "--threads", "2"])
            self.assertEqual(said.getvalue().count("note:"), 1, said.getvalue())
            self.assertIn("3 compute blades of 2 threads share localhost, whose processes get 4 CPUs", said.getvalue())

    def test_this_machine_counts_its_affinity(self):
        h = load_cluster(None).compute[0].host
        self.assertEqual(cluster.cpus_of_a_process(h), len(os.sched_getaffinity(0)))


class Preflight(unittest.TestCase):
    def test_verbs_hosts_are_asked_by_verbs_info(self):
        """Each host runs `compute-blade verbs-info` (with the device named);
        its failure is a problem naming the host and its last line, and a
        provider without thread domains is reported."""
        text = ('[defaults]\ntransport = "verbs"\ndevice = "mlx5_1"\nworkdir = "/w"\n'
                '[[memory_blade]]\nhost = "node1"\nport = 7000\n[[compute_blade]]\nhost = "node2"\nthreads = 4\n')
        c = load_cluster(cluster_file(text))
        asked = []

        def fake_run(h, argv, timeout=30):
            asked.append((h.name, argv))
            out, rc, err = "", 0, ""
            if argv[-1] == "--version":
                out = cluster.subprocess.run([str(cluster.REPO / "target/release/compute-blade"), "--version"],
                                             capture_output=True, text=True).stdout
            elif "verbs-info" in argv:
                if h.name == "node1":
                    rc, err = 1, "Error: no active port on mlx5_1; bring a link up\n"
                    out = "locked memory limit: unlimited\nhuge pages (2 MiB): 8 reserved, 8 free\n"
                else:
                    out = ("mlx5_1: max 1 QPs; atomics yes; thread domains no (per-thread-db binds ...)\n"
                           "locked memory limit: 65536 bytes, under 1 GiB: registering a blade's region may fail\n"
                           "huge pages (2 MiB): 0 reserved, 0 free (optional: ...)\n")
            elif argv == ["nproc"]:
                out = "8\n"
            return cluster.subprocess.CompletedProcess(argv, rc, out, err)

        real = cluster.Host.run
        cluster.Host.run = fake_run
        said = io.StringIO()
        try:
            with contextlib.redirect_stdout(said):
                problems = cluster.preflight(c)
        finally:
            cluster.Host.run = real
        self.assertIn("preflight: node2: mlx5_1 has no thread domains", said.getvalue())
        info = [(n, a) for n, a in asked if "verbs-info" in a]
        self.assertEqual([n for n, _ in info], ["node1", "node2"])
        self.assertEqual(info[0][1], ["/w/target/release/compute-blade", "verbs-info", "--device", "mlx5_1"])
        self.assertIn("node1: compute-blade verbs-info failed: Error: no active port on mlx5_1; bring a link up",
                      problems)
        self.assertFalse(any(p.startswith("node2: compute-blade verbs-info") for p in problems), problems)
        self.assertIn("node2: memlock limit (ulimit -l unlimited or at least 1 GiB) check failed: 65536 bytes, "
                      "under 1 GiB: registering a blade's region may fail", problems)
        self.assertFalse(any(p.startswith("node1: memlock") for p in problems), problems)
        self.assertIn("preflight: node2: no huge pages reserved", said.getvalue())
        # One verbs-info per host, and nothing else asked of it for verbs.
        self.assertFalse(any(a[:1] == ["sh"] for _, a in asked), asked)


class Figures(unittest.TestCase):
    def test_every_figure_builds_in_both_modes_with_distinct_points(self):
        for name in figures.FIGURES:
            for mode in ("quick", "full"):
                f = figures.build(name, mode, 96)
                keys = [(p.panel, p.series, p.x) for p in f.points]
                self.assertTrue(keys, name)
                self.assertEqual(len(keys), len(set(keys)), f"{name} {mode}: a point twice")
                self.assertTrue(set(p.panel for p in f.points) <= set(f.panels), name)
                if f.reference:
                    self.assertTrue(figures.reference(f), name)

    def test_every_reference_curve_names_a_panel_and_series_of_its_figure(self):
        with_reference = []
        for name in figures.FIGURES:
            f = figures.build(name, "full", 96)
            ours = {(p.panel, p.series) for p in f.points}
            metrics = [m.key for m in f.metrics]
            for (metric, *key), pts in figures.reference(f).items():
                self.assertIn(tuple(key), ours, f"figure {name}: the paper's curve {key} matches none of ours")
                self.assertIn(metric, metrics, f"figure {name}: the paper's curve {key} is of no metric of ours")
                self.assertGreater(len(pts), 1, (name, key))
            if f.reference:
                with_reference.append(name)
        self.assertEqual(with_reference, ["3a", "3b", "4", "5", "7", "8", "9", "10", "11", "12", "12df", "13a", "13b", "14", "table1"])

    def test_figure_14_has_the_papers_curves_of_both_metrics_for_each_step(self):
        f = figures.build("14", "full", 96)
        ref = figures.reference(f)
        for metric in ("throughput_mops", "retries_per_op"):
            for _, label in figures.CONFLICT_STEPS:
                self.assertEqual([x for x, _ in ref[(metric, "update-only", label)]], [1, 16, 32, 48, 64, 80, 88, 96])
        # Each step is its own --conflict-avoid-parts (none without ConflictAvoid).
        parts = {p.series: p.args[p.args.index("--conflict-avoid-parts") + 1] if "--conflict-avoid-parts" in p.args
                 else None for p in f.points}
        self.assertEqual(parts, dict((label, p) for p, label in figures.CONFLICT_STEPS))

    def test_threads_never_exceed_the_cluster(self):
        f = figures.build("8", "full", 24)
        self.assertEqual(max(p.x for p in f.points), 24)

    def test_a_resumed_figure_keeps_only_this_modes_and_builds_points(self):
        f = figures.build("3a", "quick", 2)
        p0, p1 = f.points[0], f.points[1]

        def line(p, mode="quick", commit="abc", x=None):
            return json.dumps({"mode": mode, "panel": p.panel, "series": p.series, "x": p.x if x is None else x,
                               "record": {"provenance": {"commit": commit}}})
        lines = [line(p0), line(p0), line(p1, mode="full"), line(p1, commit="old"), line(p1, x=99), "{not json",
                 json.dumps({"mode": "quick", "panel": p1.panel, "series": p1.series, "x": p1.x,
                             "record": {"parts": [{"provenance": {"commit": "abc"}}]}})]
        kept, dropped = figures.resumable(f, "quick", lines, "abc")
        self.assertEqual(kept, [lines[0], lines[6]])
        self.assertEqual(dropped, {"another mode": 1, "another commit": 1, "not in this sweep": 1, "unreadable": 1,
                                   "repeated": 1})

    def test_unknown_figures_are_refused(self):
        self.assertEqual(figures.main(["9", "nine"]), 2)
        self.assertEqual(figures.main(["99"]), 2)


if __name__ == "__main__":
    unittest.main()
