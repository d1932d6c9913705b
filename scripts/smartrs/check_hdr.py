"""Reads the latency histogram of result records with the Python HdrHistogram
library (the `hdrhistogram` package, as any HdrHistogram tool would) and
checks that it holds the record's sample count and gives the record's
percentiles and maximum.

    python3 scripts/smartrs/check_hdr.py RECORD.json [RECORD.json ...]
"""

import json
import sys

from hdrh.histogram import HdrHistogram


def check(path: str) -> list[str]:
    rec = json.load(open(path))
    h = rec["latency_hist"]
    bad = []
    if h["encoding"] != "hdrhistogram-v2-compressed-base64" or h["unit"] != "ns":
        return [f"{path}: encoding {h['encoding']!r}, unit {h['unit']!r}"]
    hist = HdrHistogram.decode(h["hdr"])
    if hist.get_total_count() != h["count"]:
        bad.append(f"{path}: {hist.get_total_count()} samples decoded, the record says {h['count']}")
    for key, pct in (("p50", 50.0), ("p99", 99.0), ("p999", 99.9)):
        # The record caps a percentile at the exact maximum, as below.
        got = min(hist.get_value_at_percentile(pct), h["max"]) / 1000.0
        want = rec["latency_us"][key]
        # The two libraries round a percentile to a sample's rank apart
        # (Python's hdrh rounds, the Rust crate takes the ceiling): the
        # record must hold a value within 1.5 ranks of HdrHistogram's.
        slack = 150.0 / max(1, h["count"])
        lo = min(hist.get_value_at_percentile(max(0.0, pct - slack)), h["max"]) / 1000.0
        hi = min(hist.get_value_at_percentile(min(100.0, pct + slack)), h["max"]) / 1000.0
        if not (lo - 1e-9 * max(1.0, want) <= want <= hi + 1e-9 * max(1.0, want)):
            bad.append(f"{path}: {key}: HdrHistogram says {got} us, the record {want} us")
    if hist.get_max_value() < h["max"] * 0.999:
        bad.append(f"{path}: max {hist.get_max_value()} ns decoded, the record's exact max is {h['max']} ns")
    if not bad:
        print(f"check_hdr: {path}: {h['count']} samples, p50/p99/p999 "
              f"{rec['latency_us']['p50']}/{rec['latency_us']['p99']}/{rec['latency_us']['p999']} us agree")
    return bad


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    bad = [b for p in argv for b in check(p)]
    for b in bad:
        print(f"check_hdr: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
