"""Checks what `scripts/figure all --quick` made (CI runs it): for every
figure, a PNG and a PDF that are images, JSON lines that parse, and every
(panel, series, x) point of the figure's sweep present with a record of a
clean timed run; a Markdown table per panel, labelled when there are
several.

    python3 scripts/smartrs/check_figures.py [OUT] [--cluster FILE]
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402
from cluster import REPO, load_cluster  # noqa: E402


def main(argv: list[str]) -> int:
    cluster_file = argv[argv.index("--cluster") + 1] if "--cluster" in argv else None
    rest = [a for a in argv if a != "--cluster" and a != cluster_file]
    out = Path(rest[0]) if rest else REPO / "results" / "figures"
    cluster = load_cluster(cluster_file)
    bad = []
    for name in figures.FIGURES:
        fig = figures.build(name, "quick", cluster.max_threads(), len(cluster.memory))
        for ext, magic in (("png", b"\x89PNG"), ("pdf", b"%PDF")):
            p = out / f"fig{name}.{ext}"
            if not p.exists() or not p.read_bytes().startswith(magic):
                bad.append(f"{p}: missing or not a {ext.upper()}")
        jl = out / f"fig{name}.jsonl"
        if not jl.exists():
            bad.append(f"{jl}: missing")
            continue
        rows = [json.loads(line) for line in jl.read_text().splitlines() if line.strip()]
        got = {(r["panel"], r["series"], r["x"]) for r in rows}
        want = {(p.panel, p.series, p.x) for p in fig.points}
        if got != want:
            bad.append(f"{jl}: missing points {sorted(want - got)[:4]}, unexpected {sorted(got - want)[:4]}")
        md = out / f"fig{name}.md"
        panels = list(dict.fromkeys(r["panel"] for r in rows))
        text = md.read_text() if md.exists() else ""
        tables = text.count("\n|---")
        if tables != len(panels):
            bad.append(f"{md}: {tables} tables for {len(panels)} panels")
        if len(panels) > 1:
            for p in panels:
                if f"**({p}) " not in text and f"**{p}**" not in text:
                    bad.append(f"{md}: panel {p} has no label")
        for r in rows:
            rec = r["record"]
            if rec.get("ops", 0) <= 0 or rec.get("errors") or rec.get("violations"):
                bad.append(f"{jl}: {r['panel']} {r['series']} x={r['x']}: ops {rec.get('ops')} errors "
                           f"{rec.get('errors')} violations {rec.get('violations')}")
            if "provenance" not in rec and "parts" not in rec:
                bad.append(f"{jl}: a record without provenance")
        print(f"fig {name}: {len(rows)} runs, {len(set(r['series'] for r in rows))} series, png and pdf")
    for b in bad:
        print(f"check_figures: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
