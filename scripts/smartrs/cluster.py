"""The cluster file and the launcher: memory blades and compute blades on
this machine, over ssh, or with srun inside a Slurm allocation.

A cluster file (TOML) names every process of a run; no script holds a
hostname. `scripts/cluster.localhost.toml` is the default: one memory blade
on this machine. See `scripts/cluster.example.toml` for every field.

The launcher never sleeps blindly: it waits for each memory blade's `ready`
line (with a time-out), starts compute blades that meet at a `--barrier`,
and on failure, time-out or Ctrl-C stops everything it started (SIGTERM,
then SIGKILL) and keeps every log under its output directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


class LaunchError(Exception):
    """A launch that failed: the message says which process and why."""


@dataclass
class Host:
    """Where a process runs and how it is started there."""

    name: str  # the host name or address compute blades reach it by
    launch: str  # local | ssh | srun
    ssh: str = ""  # ssh destination (user@host), default: name
    ssh_port: int = 0
    ssh_options: list[str] = field(default_factory=list)
    workdir: str = ""  # the repository checkout on that host
    bin: str = "target/release"

    def binary(self, name: str) -> str:
        b = Path(self.bin)
        if self.launch == "local" and not b.is_absolute():
            return str(REPO / b / name)
        return str(b / name) if b.is_absolute() else f"{self.workdir}/{self.bin}/{name}"

    def wrap(self, argv: list[str], env: dict[str, str]) -> list[str]:
        """The local command line that runs `argv` on this host; the process
        prints `pid N` first, so that it can be stopped by its PID."""
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        inner = f"echo pid $$; {'export ' + exports + '; ' if exports else ''}exec {shlex.join(argv)}"
        if self.launch == "local":
            return ["sh", "-c", inner]
        remote = f"cd {shlex.quote(self.workdir)} && {inner}"
        if self.launch == "ssh":
            return self.ssh_argv() + ["sh -c " + shlex.quote(remote)]
        if self.launch == "srun":
            return ["srun", "--nodes=1", "--ntasks=1", "--overlap", f"--nodelist={self.name}", "sh", "-c", remote]
        raise LaunchError(f"host {self.name}: unknown launch {self.launch!r} (local, ssh or srun)")

    def ssh_argv(self) -> list[str]:
        ctl = Path(os.environ.get("SMART_RS_SSH_CONTROL_DIR", "/tmp")) / "smart-rs-ssh-%C"
        a = ["ssh", "-o", "BatchMode=yes", "-o", "ControlMaster=auto", "-o", f"ControlPath={ctl}",
             "-o", "ControlPersist=60", "-o", "ConnectTimeout=10"]
        if self.ssh_port:
            a += ["-p", str(self.ssh_port)]
        return a + self.ssh_options + [self.ssh or self.name]

    def run(self, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        """Runs a short command on this host and returns its output."""
        if self.launch == "local":
            cmd = argv
        elif self.launch == "ssh":
            cmd = self.ssh_argv() + [f"cd {shlex.quote(self.workdir)} && {shlex.join(argv)}"]
        else:
            cmd = ["srun", "--nodes=1", "--ntasks=1", "--overlap", f"--nodelist={self.name}", "sh", "-c",
                   f"cd {shlex.quote(self.workdir)} && {shlex.join(argv)}"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@dataclass
class MemoryBlade:
    host: Host
    port: int
    size: str
    backing_file: str = ""
    transport: str = "tcp"
    device: str = ""
    gid_index: int | None = None
    listen: str = ""  # the address it listens on (default: 127.0.0.1 here, 0.0.0.0 elsewhere)
    durable: bool = False  # memory-blade --durable: writes on disk before they complete
    address: str = ""  # the address compute blades connect to (default: see `reach`)

    def listen_on(self) -> str:
        """`--listen`'s value: `listen` (default 127.0.0.1 here, 0.0.0.0
        elsewhere) and the port."""
        a = self.listen or ("127.0.0.1" if self.host.launch == "local" else "0.0.0.0")
        return f"{_bracketed(a)}:{self.port}"

    def reach(self) -> str:
        """The address compute blades connect to: `address` if given, else
        the one address it listens on, else 127.0.0.1 for a blade on this
        machine, else its host name."""
        a = self.address or (self.listen if self.listen not in ("", "0.0.0.0", "::") else "")
        return _bracketed(a or ("127.0.0.1" if self.host.launch == "local" else self.host.name))


def _bracketed(a: str) -> str:
    """An IPv6 address in brackets, as HOST:PORT needs it."""
    return f"[{a}]" if ":" in a and not a.startswith("[") else a


@dataclass
class ComputeHost:
    host: Host
    threads: int
    oversubscribe: bool = False  # run even when a process there gets fewer CPUs than threads


@dataclass
class Cluster:
    path: Path
    sha256: str
    memory: list[MemoryBlade]
    compute: list[ComputeHost]
    transport: str
    secret_file: str = ""  # the cluster secret, on every host at this path (--secret-file)
    coordinator: str = ""  # etcd's URL, http://HOST:PORT[/CLUSTER] (--coordinator), for the FORD runs

    def max_threads(self) -> int:
        return min(c.threads for c in self.compute)


def _host(d: dict, defaults: dict, where: str) -> Host:
    name = d.get("host", "localhost")
    launch = d.get("launch", defaults.get("launch"))
    if launch is None:
        launch = "local" if name in LOCAL_HOSTS else "ssh"
    if launch not in ("local", "ssh", "srun"):
        raise LaunchError(f"{where}: launch must be local, ssh or srun, not {launch!r}")
    if launch == "srun" and "SLURM_JOB_ID" not in os.environ and not os.environ.get("SMART_RS_SRUN_DRY"):
        raise LaunchError(f"{where}: launch = \"srun\" needs a Slurm allocation (salloc/sbatch; SLURM_JOB_ID unset)")
    return Host(
        name=name,
        launch=launch,
        ssh=d.get("ssh", defaults.get("ssh", "")),
        ssh_port=int(d.get("ssh_port", defaults.get("ssh_port", 0))),
        ssh_options=list(d.get("ssh_options", defaults.get("ssh_options", []))),
        workdir=d.get("workdir", defaults.get("workdir", str(REPO))),
        bin=d.get("bin", defaults.get("bin", "target/release")),
    )


HOST_KEYS = {"host", "launch", "ssh", "ssh_port", "ssh_options", "workdir", "bin"}
MEMORY_KEYS = HOST_KEYS | {"port", "size", "backing_file", "durable", "listen", "address", "device", "gid_index"}
COMPUTE_KEYS = HOST_KEYS | {"threads", "oversubscribe"}
DEFAULTS_KEYS = (HOST_KEYS - {"host"}) | {"transport", "device", "gid_index", "oversubscribe", "secret_file",
                                          "coordinator"}


def _known(table: dict, keys: set[str], where: str) -> None:
    """Refuses a field the launcher does not read (a typo would otherwise
    be ignored silently)."""
    unknown = sorted(set(table) - keys)
    if unknown:
        raise LaunchError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(keys))})")


def load_cluster(path: str | Path | None) -> Cluster:
    """Reads and checks a cluster file (default: one local memory blade)."""
    p = Path(path) if path else REPO / "scripts" / "cluster.localhost.toml"
    raw = p.read_bytes()
    try:
        doc = tomllib.loads(raw.decode())
    except tomllib.TOMLDecodeError as e:
        raise LaunchError(f"{p}: not valid TOML: {e}") from None
    unknown = set(doc) - {"defaults", "memory_blade", "compute_blade"}
    if unknown:
        raise LaunchError(f"{p}: unknown section(s) {sorted(unknown)} (defaults, memory_blade, compute_blade)")
    defaults = doc.get("defaults", {})
    _known(defaults, DEFAULTS_KEYS, f"{p}: [defaults]")
    for i, m in enumerate(doc.get("memory_blade", [])):
        _known(m, MEMORY_KEYS, f"{p}: memory_blade {i + 1}")
    for i, c in enumerate(doc.get("compute_blade", [])):
        _known(c, COMPUTE_KEYS, f"{p}: compute_blade {i + 1}")
    transport = defaults.get("transport", "tcp")
    if transport not in ("tcp", "verbs"):
        raise LaunchError(f"{p}: transport must be tcp or verbs, not {transport!r}")
    mem = []
    for i, m in enumerate(doc.get("memory_blade", [])):
        where = f"{p}: memory_blade {i + 1}"
        h = _host(m, defaults, where)
        port = int(m.get("port", 0))
        if port == 0 and h.launch != "local":
            raise LaunchError(f"{where}: a remote memory blade needs a fixed port (port = 0 only on this machine)")
        durable = m.get("durable", False)
        if not isinstance(durable, bool):
            raise LaunchError(f"{where}: durable is true or false, not {durable!r}")
        if durable and not m.get("backing_file"):
            raise LaunchError(f"{where}: durable = true needs a backing_file (the disk its writes are synced to)")
        if durable and transport != "tcp":
            raise LaunchError(f"{where}: durable = true serves tcp only (an RNIC's writes bypass the blade's CPU)")
        mem.append(MemoryBlade(h, port, str(m.get("size", "1GiB")), m.get("backing_file", ""),
                               transport, m.get("device", defaults.get("device", "")),
                               m.get("gid_index", defaults.get("gid_index")), m.get("listen", ""), durable,
                               m.get("address", "")))
    if not mem:
        raise LaunchError(f"{p}: no [[memory_blade]]")
    comp = []
    for i, c in enumerate(doc.get("compute_blade", [{"host": "localhost"}])):
        where = f"{p}: compute_blade {i + 1}"
        threads = int(c.get("threads", os.cpu_count() or 1))
        if threads < 1:
            raise LaunchError(f"{where}: threads must be at least 1")
        over = c.get("oversubscribe", defaults.get("oversubscribe", False))
        if not isinstance(over, bool):
            raise LaunchError(f"{where}: oversubscribe is true or false, not {over!r}")
        comp.append(ComputeHost(_host(c, defaults, where), threads, over))
    secret = defaults.get("secret_file", "")
    if not isinstance(secret, str):
        raise LaunchError(f"{p}: secret_file is a path, not {secret!r}")
    coordinator = defaults.get("coordinator", "")
    if not isinstance(coordinator, str) or (coordinator and not coordinator.startswith("http://")):
        raise LaunchError(f"{p}: coordinator is etcd's URL, http://HOST:PORT[,HOST:PORT…][/CLUSTER], not {coordinator!r}")
    return Cluster(p, hashlib.sha256(raw).hexdigest(), mem, comp, transport, secret, coordinator)


class Proc:
    """A process the launcher started: its log, its remote PID, its host."""

    def __init__(self, name: str, host: Host, argv: list[str], log: Path, env: dict[str, str]):
        self.name, self.host, self.log = name, host, log
        self.out = open(log, "w")
        self.popen = subprocess.Popen(host.wrap(argv, env), stdout=subprocess.PIPE, stderr=self.out, text=True,
                                      start_new_session=True)
        self.pid: int | None = None
        self.lines: list[str] = []
        self.eof = False
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.popen.stdout:
            with self._cond:
                if self.pid is None and line.startswith("pid "):
                    self.pid = int(line.split()[1])
                else:
                    self.lines.append(line)
                    self.out.write(line)
                    self.out.flush()
                self._cond.notify_all()
        with self._cond:
            self.eof = True
            self._cond.notify_all()

    def wait_line(self, prefix: str, timeout: float) -> str:
        """Waits for a stdout line starting with `prefix` (never a blind
        sleep); fails when the process exits first or the time-out passes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line.strip()
                if self.eof:
                    self.popen.wait()
                    raise LaunchError(f"{self.name} on {self.host.name} exited with status {self.popen.returncode} "
                                      f"before {prefix.strip()!r}: {tail(self.log)}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LaunchError(f"{self.name} on {self.host.name}: no {prefix.strip()!r} line within "
                                      f"{timeout:.0f} s (log: {self.log})")
                self._cond.wait(min(left, 0.2))

    def signal(self, sig: int) -> None:
        if self.pid is None:
            if self.popen.poll() is None:
                os.killpg(self.popen.pid, sig)
            return
        if self.host.launch == "local":
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass
        else:
            try:
                self.host.run(["kill", f"-{signal.Signals(sig).name[3:]}", str(self.pid)], timeout=15)
            except subprocess.TimeoutExpired:
                pass

    def stop(self, grace: float = 10) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; the local side too."""
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(10)
        self.out.close()


def tail(log: Path, n: int = 5) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:]) or "(empty log)"


class Launcher:
    """Starts and stops the processes of one run; a context manager that
    stops everything it started when the run ends, fails or is
    interrupted."""

    def __init__(self, cluster: Cluster, out: Path, ready_timeout: float = 60):
        self.cluster, self.out, self.ready_timeout = cluster, out, ready_timeout
        self.procs: list[Proc] = []
        self.blades: list[tuple[Proc, str]] = []
        self.seq = 0
        # The threads a run's compute blades use (None: each host's declared
        # most), checked once against the CPUs a process gets there.
        self.threads: int | None = None
        self.cpus_checked = False
        self.cpus: dict[tuple[str, str], int] = {}  # CPUs per process, by (launch, host)
        self.shared_noted: set[tuple] = set()
        out.mkdir(parents=True, exist_ok=True)
        self.env = {"SMART_RS_CLUSTER_SHA256": cluster.sha256, "RUST_BACKTRACE": "0"}

    def __enter__(self) -> "Launcher":
        # SIGTERM and SIGINT both stop the run (SIGINT even when a shell
        # started this in the background with SIGINT ignored).
        self._old = signal.signal(signal.SIGTERM, _raise_interrupt)
        self._old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()
        signal.signal(signal.SIGTERM, self._old)
        signal.signal(signal.SIGINT, self._old_int)

    def link_flags(self) -> list[str]:
        c = self.cluster
        a = ["--transport", c.transport]
        if c.secret_file:
            a += ["--secret-file", c.secret_file]
        m = c.memory[0]
        if c.transport == "verbs":
            if m.device:
                a += ["--device", m.device]
            if m.gid_index is not None:
                a += ["--gid-index", str(m.gid_index)]
        return a

    def coordinator_flags(self, sub: list[str]) -> list[str]:
        """`--coordinator URL` for the subcommands that take one (the FORD
        databases'), when the cluster file names a coordinator."""
        takes = bool(sub) and sub[0] in ("smallbank", "tatp", "rebuild")
        return ["--coordinator", self.cluster.coordinator] if takes and self.cluster.coordinator else []

    def memory_argv(self, m: MemoryBlade, listen: str) -> list[str]:
        """The command line of memory blade `m`, listening on `listen`."""
        argv = [m.host.binary("memory-blade"), "--listen", listen, "--size", m.size] + self.link_flags()
        if m.backing_file:
            argv += ["--backing-file", m.backing_file]
        if m.durable:
            argv.append("--durable")
        return argv

    def start_blades(self) -> str:
        """Starts every memory blade, waits for each `ready` line, checks
        that every compute host reaches every blade; returns the compute
        blades' `--blades` value. Before the first start, checks that a
        process on every compute host gets a CPU per thread."""
        if not self.cpus_checked:
            problems = cpu_problems(self.cluster, self.threads, self.cpus)
            if problems:
                raise LaunchError("; ".join(problems))
            self.cpus_checked = True
        addrs = []
        for i, m in enumerate(self.cluster.memory):
            p = self.spawn(f"memory-blade-{i + 1}", m.host, self.memory_argv(m, m.listen_on()))
            ready = p.wait_line("ready ", self.ready_timeout)
            port = ready.split()[1].rsplit(":", 1)[1]
            host = m.reach()
            addrs.append(f"{host}:{port}")
            self.blades.append((p, f"{host}:{port}"))
        blades = ",".join(addrs)
        problems = check_reachable(self.cluster, blades)
        if problems:
            raise LaunchError("; ".join(problems))
        return blades

    def stop_blades(self) -> None:
        for p, _ in self.blades:
            p.stop()
            self.procs.remove(p)
        self.blades = []

    def spawn(self, name: str, host: Host, argv: list[str]) -> Proc:
        self.seq += 1
        p = Proc(name, host, argv, self.out / f"{self.seq:04d}-{name}.log", self.env)
        self.procs.append(p)
        return p

    def compute(self, host: Host, args: list[str], name: str = "compute-blade") -> Proc:
        return self.spawn(name, host, [host.binary("compute-blade")] + args)

    def fetch(self, host: Host, remote: str, local: Path) -> None:
        """Moves a record a compute blade wrote on another host here."""
        r = host.run(["sh", "-c", f"cat {shlex.quote(remote)} && rm -f {shlex.quote(remote)}"], timeout=30)
        if r.returncode != 0:
            raise LaunchError(f"fetching {remote} from {host.name}: {r.stderr.strip()}")
        local.write_text(r.stdout)

    def wait_all(self, procs: list[Proc], timeout: float) -> None:
        """Waits for every process; the first failure (or the time-out)
        stops all of them and raises, naming the process and its log."""
        deadline = time.monotonic() + timeout
        pending = list(procs)
        while pending:
            for p in list(pending):
                rc = p.popen.poll()
                if rc is None:
                    continue
                pending.remove(p)
                if rc != 0:
                    for q in pending:
                        q.stop(grace=5)
                    raise LaunchError(f"{p.name} on {p.host.name} failed (status {rc}): {tail(p.log)}")
            if pending and time.monotonic() > deadline:
                for q in pending:
                    q.stop(grace=5)
                raise LaunchError(f"{', '.join(q.name for q in pending)} still running after {timeout:.0f} s; stopped")
            time.sleep(0.05)
        for p in procs:
            p.out.close()
            self.procs.remove(p)

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            try:
                p.stop()
            except Exception as e:  # keep stopping the others
                print(f"launcher: stopping {p.name}: {e}", file=sys.stderr)
        self.procs = []
        self.blades = []

    def note_shared_hosts(self, hosts: list[Host], sub: list[str]) -> None:
        """Says (once per host and count) when compute blades spread over too
        few hosts share one beyond its CPUs: a scale-out figure then
        measures the sharing, not more machines."""
        try:
            t = int(sub[sub.index("--threads") + 1]) if "--threads" in sub else 1
        except (IndexError, ValueError):
            return
        per: dict[tuple[str, str], int] = {}
        for h in hosts:
            per[(h.launch, h.name)] = per.get((h.launch, h.name), 0) + 1
        for key, k in per.items():
            n = self.cpus.get(key)
            if k > 1 and n and k * t > n and (key, k) not in self.shared_noted:
                self.shared_noted.add((key, k))
                print(f"launcher: note: {k} compute blades of {t} threads share {key[1]}, whose processes get "
                      f"{n} CPUs: they take turns on them (list more [[compute_blade]] hosts to spread them)",
                      file=sys.stderr)

    def run_multi(self, blades: str, sub: list[str], processes: int, json_out: Path, tag: str,
                  timeout: float, load: list[str] | None = None) -> dict:
        """One loader (when `load` is given, e.g. `--load-only` flags), then
        `processes` compute blades spread over the compute hosts, meeting at
        a barrier; their records merged into `json_out`."""
        common = ["--blades", blades] + self.link_flags() + self.coordinator_flags(sub)
        hosts = [self.cluster.compute[i % len(self.cluster.compute)].host for i in range(processes)]
        self.note_shared_hosts(hosts, sub)
        if load is not None:
            loader = [a for a in sub if a != "--no-load"]
            ld = self.compute(hosts[0], loader + common + load + ["--quiet"], name=f"{tag}-load")
            self.wait_all([ld], timeout)
        parts, procs = [], []
        for i, h in enumerate(hosts):
            local = self.out / f"{tag}-p{i + 1}.json"
            # Here the record goes straight to its place; elsewhere to /tmp
            # on that host, fetched (and removed) after the run.
            remote = str(local) if h.launch == "local" else f"/tmp/smart-rs-{os.getpid()}-{tag}-{i}.json"
            # One barrier name per launcher and party count: a root on blade 0
            # each, reused run after run by generation.
            extra = ["--barrier", f"launcher-{os.getpid()}-n{processes}:{processes}"] if processes > 1 else []
            procs.append(self.compute(h, sub + common + extra + ["--quiet", "--json", remote], name=f"{tag}-p{i + 1}"))
            parts.append((h, remote, local))
        try:
            self.wait_all(procs, timeout)
            for h, remote, local in parts:
                if h.launch != "local":
                    self.fetch(h, remote, local)
        finally:
            # Stopped first (a stopped compute blade still writes its
            # record), then their files elsewhere removed.
            for p in procs:
                p.stop(grace=5)
            for h, remote, _ in parts:
                if h.launch != "local":
                    try:
                        h.run(["rm", "-f", remote], timeout=15)
                    except subprocess.TimeoutExpired:
                        pass
        if processes == 1:
            json_out.write_bytes(parts[0][2].read_bytes())
        else:
            # The merge runs here, with this machine's binary.
            m = subprocess.run([str(REPO / "target/release/compute-blade"), "merge", *[str(p[2]) for p in parts],
                                "--json", str(json_out)], capture_output=True, text=True)
            if m.returncode != 0:
                raise LaunchError(f"merging {tag}: {m.stderr.strip()}")
        return json.loads(json_out.read_text())


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def guarded(prog: str, logs: Path, body) -> int:
    """Runs `body()` (which uses a [`Launcher`] and returns the exit status)
    and turns a launch failure or an interrupt into its message and status
    (1, or 130): by then the launcher has stopped everything it started."""
    try:
        return body()
    except LaunchError as e:
        print(f"{prog}: {e}\n(every process it started is stopped; logs in {logs})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; every process it started is stopped; logs in {logs}", file=sys.stderr)
        return 130


def preflight(cluster: Cluster) -> list[str]:
    """Checks every host before a run; returns the problems found (empty:
    ready to run). Binaries present and built from the commit here; for
    verbs, what `compute-blade verbs-info` says of each host (see
    [`verbs_problems`]); the
    memory blades' ports reachable from the compute hosts; a CPU per
    thread for every compute blade."""
    problems = []
    local = subprocess.run([str(REPO / "target/release/compute-blade"), "--version"], capture_output=True, text=True)
    want = version_commit(local.stdout) if local.returncode == 0 else None
    if want is None:
        problems.append("this machine: target/release/compute-blade missing (cargo build --release)")
    hosts: dict[tuple, Host] = {}
    for m in cluster.memory:
        hosts[(m.host.launch, m.host.name, "memory-blade")] = m.host
    for c in cluster.compute:
        hosts[(c.host.launch, c.host.name, "compute-blade")] = c.host
    for (_, name, binary), h in hosts.items():
        try:
            r = h.run([h.binary(binary), "--version"], timeout=30)
        except subprocess.TimeoutExpired:
            problems.append(f"{name}: no answer within 30 s")
            continue
        if r.returncode != 0:
            problems.append(f"{name}: {binary} --version failed: {(r.stderr or r.stdout).strip()[:200]}")
            continue
        got = version_commit(r.stdout)
        if want and got != want:
            problems.append(f"{name}: {binary} is {r.stdout.strip()}, this machine has {want} (rebuild there)")
    if cluster.transport == "verbs":
        for h in {(h.launch, h.name): h for h in hosts.values()}.values():
            dev = next((m.device for m in cluster.memory if m.host is h), "") or cluster.memory[0].device
            problems += verbs_problems(h, dev)
    try:
        problems += cpu_problems(cluster)
    except (LaunchError, subprocess.TimeoutExpired) as e:
        problems.append(str(e))
    return problems


def version_commit(version: str) -> str:
    """The commit in `compute-blade --version`'s line (`compute-blade 0.1.0
    (commit ABC…)`): what the records of that binary carry."""
    return version.strip().rsplit(" ", 1)[-1].rstrip(")")


def verbs_problems(h: Host, dev: str) -> list[str]:
    """What one `compute-blade verbs-info` on host `h` finds wrong for the
    verbs backend: no device (or not `dev`) with an active port, or a
    locked-memory limit under 1 GiB (its line `locked memory limit: N
    bytes, under 1 GiB…`). A provider without thread domains and a host
    without huge pages are reported, not refused."""
    name = h.name
    info = h.run([h.binary("compute-blade"), "verbs-info"] + (["--device", dev] if dev else []), timeout=60)
    problems = []
    if info.returncode != 0:
        why = (info.stderr.strip().splitlines() or ["(no message)"])[-1]
        problems.append(f"{name}: compute-blade verbs-info failed: {why[:300]}")
    elif "thread domains no" in info.stdout:
        print(f"preflight: {name}: {dev or 'its RDMA device'} has no thread domains: per-thread doorbells "
              f"(--smart thd-res-alloc) then come from the order QPs are created in, as on rxe")
    for line in info.stdout.splitlines():
        if line.startswith("locked memory limit: ") and "under 1 GiB" in line:
            problems.append(f"{name}: memlock limit (ulimit -l unlimited or at least 1 GiB) check failed: "
                            f"{line.split(': ', 1)[1]}")
        elif line.startswith("huge pages (2 MiB): 0 reserved"):
            print(f"preflight: {name}: no huge pages reserved (optional; large blades register faster with them)")
    return problems


def cpus_of_a_process(h: Host) -> int:
    """The CPUs a process started on `h` the launcher's way may run on
    (`nproc`: its affinity, which a Slurm step's binding or a cgroup
    narrows)."""
    if h.launch == "local":
        return len(os.sched_getaffinity(0))
    r = h.run(["nproc"], timeout=30)
    if r.returncode != 0 or not r.stdout.strip().isdigit():
        raise LaunchError(f"{h.name}: nproc failed: {(r.stderr or r.stdout).strip()[:200]}")
    return int(r.stdout.strip())


def cpu_problems(cluster: Cluster, threads: int | None = None, seen: dict | None = None) -> list[str]:
    """Every compute host whose processes get fewer CPUs than the threads a
    compute blade runs there (`threads`, or the host's declared most): its
    threads would take turns on the CPUs, and the run would measure that.
    Inside a Slurm allocation that is the default of `salloc -N 4`: one CPU
    per node, which every step is bound to. `seen`, if given, gets each
    checked host's CPUs, by (launch, name)."""
    problems = []
    seen = {} if seen is None else seen
    for i, c in enumerate(cluster.compute):
        if c.oversubscribe:
            continue
        key = (c.host.launch, c.host.name)
        if key not in seen:
            seen[key] = cpus_of_a_process(c.host)
        n, t = seen[key], threads or c.threads
        if t <= n:
            continue
        how = {"local": "on this machine", "ssh": "over ssh", "srun": "by srun in this allocation"}[c.host.launch]
        fix = ("allocate whole nodes (salloc --exclusive) or enough CPUs (salloc -c N)"
               if c.host.launch == "srun" else "lower threads")
        problems.append(f"compute blade {i + 1} on {c.host.name}: {t} threads, but a process started there {how} "
                        f"gets {n} CPU{'s' if n != 1 else ''} (nproc), so its threads would share them: {fix}, "
                        f"or set oversubscribe = true to run anyway")
    return problems


def check_reachable(cluster: Cluster, blades: str) -> list[str]:
    """After the blades started: every compute host reaches every blade."""
    problems = []
    for c in cluster.compute:
        for a in blades.split(","):
            host, port = a.rsplit(":", 1)
            if c.host.launch == "local":
                try:
                    socket.create_connection((host, int(port)), timeout=5).close()
                    ok = True
                except OSError:
                    ok = False
            else:
                ok = c.host.run(["bash", "-c", f"exec 3<>/dev/tcp/{host}/{port}"], timeout=15).returncode == 0
            if not ok:
                problems.append(f"{c.host.name} cannot reach memory blade {a}")
    return problems
