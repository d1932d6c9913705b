#!/usr/bin/env python3
"""Random damage to a FORD database's blades, then recovery (and repair).

Loads a SmallBank or TATP database over two `memory-blade` processes with
backing files on loopback, stops them, and for each seed: writes WORDS random
8-byte words over each blade's used heap (while the blades are down), starts
them on the damaged files, runs `compute-blade recover` (with `--repair`
unless --no-repair) and `--audit-only`, and compares every word of the
tables' bucket arrays with its value before the damage. Prints one line per
seed and a summary. Standard library only.

  scripts/damage-repair.py [--workload tatp|smallbank] [--seeds N]
                           [--words W] [--no-repair] [--bin DIR]

--bin: where compute-blade and memory-blade are (default target/release).
Every process it starts is stopped by its PID; the files are in a
temporary directory, removed at the end.
"""

import argparse
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

OFF_HEAP = 24  # smart_core::layout: the heap's end, in the blade's header
HEAP_START = 4096
PORTS = (7741, 7742)  # below the ephemeral range
SLOTS = 22  # ford_dtx::layout::SLOTS
BUCKET_HEADER = 32


def word(b, o):
    return struct.unpack_from("<Q", b, o)[0]


def record_bytes(value_size):
    return 48 + (value_size + 7) // 8 * 8 + 8


def tables(image):
    """The tables of the database in blade 0's image: (id, value size,
    buckets, [base per replica]), read from its catalog."""
    i = image.find(b"FORDCAT2")
    if i < 0:
        sys.exit("damage-repair: no FORD catalog on blade 0")
    out = []
    for t in range(word(image, i + 8)):
        o = i + 64 + 64 * t
        out.append((word(image, o), word(image, o + 8), word(image, o + 16),
                    [word(image, o + 32 + 8 * r) for r in range(4)]))
    return out


def array_words(tabs, blade):
    """Offsets on `blade` of the words of the tables' bucket arrays that
    something reads: records, and on the primary the home buckets' links."""
    for _tid, vs, buckets, bases in tabs:
        rb = record_bytes(vs)
        bb = BUCKET_HEADER + SLOTS * rb
        for r, base in enumerate(bases):
            if base == 0 or base >> 48 != blade:
                continue
            start = base & ((1 << 48) - 1)
            for b in range(buckets):
                o = start + b * bb
                if r == 0:
                    yield o
                yield from range(o + BUCKET_HEADER, o + bb, 8)


class Blades:
    def __init__(self, bindir, files):
        self.procs = []
        for f, port in zip(files, PORTS):
            p = subprocess.Popen(
                [os.path.join(bindir, "memory-blade"), "--listen", f"127.0.0.1:{port}",
                 "--size", "64MiB", "--backing-file", f],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.procs.append(p)
            line = p.stdout.readline()
            if not line.startswith("ready"):
                self.stop()
                sys.exit(f"damage-repair: memory blade on {f} did not start: {line!r}")
        self.list = ",".join(f"127.0.0.1:{p}" for p in PORTS)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()


def compute(bindir, args):
    r = subprocess.run([os.path.join(bindir, "compute-blade")] + args, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, RUST_BACKTRACE="0"))
    return r.returncode, r.stdout + r.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=["tatp", "smallbank"], default="tatp")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--words", type=int, default=200)
    ap.add_argument("--no-repair", action="store_true")
    ap.add_argument("--bin", default="target/release")
    a = ap.parse_args()
    size = ["--subscribers", "2000"] if a.workload == "tatp" else ["--accounts", "2000", "--hot", "50"]
    tmp = tempfile.mkdtemp(prefix="damage-repair-")
    files = [os.path.join(tmp, f"b{i}") for i in range(2)]
    try:
        blades = Blades(a.bin, files)
        code, out = compute(a.bin, [a.workload, "--blades", blades.list, "--duration", "0.3",
                                    "--warmup", "0", "--quiet", "--audit"] + size)
        blades.stop()
        if code != 0:
            sys.exit(f"damage-repair: the load failed:\n{out}")
        good = [open(f, "rb").read() for f in files]
        tabs = tables(good[0])
        words = [list(array_words(tabs, b)) for b in range(2)]
        clean = 0
        for seed in range(1, a.seeds + 1):
            rng = random.Random(seed)
            for f, g in zip(files, good):
                img = bytearray(g)
                end = word(img, OFF_HEAP)
                for _ in range(a.words):
                    struct.pack_into("<Q", img, rng.randrange(HEAP_START, end) & ~7, rng.getrandbits(64))
                with open(f, "wb") as fh:
                    fh.write(img)
            blades = Blades(a.bin, files)
            rec = ["recover", "--blades", blades.list, "--db", a.workload]
            rcode, rout = compute(a.bin, rec + ([] if a.no_repair else ["--repair"]))
            acode, aout = compute(a.bin, [a.workload, "--audit-only", "--blades", blades.list] + size)
            blades.stop()
            now = [open(f, "rb").read() for f in files]
            differ = sum(1 for b in range(2) for o in words[b] if now[b][o:o + 8] != good[b][o:o + 8])
            said = [l for l in rout.splitlines() if "repair" in l or l.startswith("Error")]
            audit = [l for l in aout.splitlines() if l.startswith("audit:") or l.startswith("Error")]
            clean += acode == 0 and differ == 0
            print(f"seed {seed}: recover exit {rcode}, audit exit {acode}, table words changed {differ}")
            for l in said + audit:
                print(f"  {l[:200]}")
        print(f"{a.workload}: {clean} of {a.seeds} databases audited clean with every table word restored "
              f"({a.words} words per blade, {'recover' if a.no_repair else 'recover --repair'})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
