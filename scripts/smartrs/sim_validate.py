#!/usr/bin/env python3
"""The validation report of the simulated figures: for each figure run with
`scripts/figure N --sim`, against the paper's curves (the Smart artifact's
reference results, which the calibration never saw):

- Smart ÷ baseline at the largest x, simulated and paper's (per panel): the
  effect of the technique where the paper measured it largest;
- where the baseline peaks (its x), simulated and paper's;
- the median |ln(simulated / paper)| over every point of the figure's first
  metric that the paper gives: how close the absolute numbers are.

Usage: python3 scripts/smartrs/sim_validate.py [DIR] [FIGURE ...]
  DIR defaults to results/figures-sim; prints a Markdown table.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import FIGURES, build, get, reference  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv and not argv[0][0].isdigit() and argv[0] != "table1" else REPO / "results" / "figures-sim"
    # The validation figures (never fitted); the calibration's own figures
    # (3a, 3b, 4, 5) and the latency-throughput curves (9, 11) only when
    # named.
    names = [a for a in argv if a in FIGURES] or ["7", "8", "10", "12", "12df", "13a", "13b", "14"]
    rows = ["| figure | panel | baseline → Smart | Smart ÷ baseline at largest x: sim | paper | baseline's peak at: sim "
            "| paper | median \\|ln(sim / paper)\\| (points) |",
            "|---|---|---|---|---|---|---|---|"]
    for n in names:
        jl = out / f"fig{n}.jsonl"
        if not jl.exists():
            continue
        fig = build(n, "quick", 96, 2, sim=True)
        recs = [json.loads(line) for line in jl.read_text().splitlines() if line.strip()]
        m = fig.metrics[0]
        ref = reference(fig)
        series = list(dict.fromkeys(r["series"] for r in recs))
        if len(series) < 2:
            continue
        base, smart = series[0], series[-1]
        for panel in fig.panels:
            ours = {s: {r["x"]: get(r["record"], m.key) * m.scale for r in recs
                        if r["panel"] == panel and r["series"] == s} for s in (base, smart)}
            if not ours[base]:
                continue
            paper = {s: dict(ref.get((m.key, panel, s), [])) for s in (base, smart)}
            xmax = max(ours[base])
            sim_ratio = ours[smart].get(xmax, math.nan) / ours[base][xmax] if ours[base][xmax] else math.nan
            pxs = [x for x in paper[base] if x in paper[smart]]
            # The paper's ratio at our largest x when it measured there, else
            # at its own largest.
            pmax = (xmax if xmax in pxs else max(pxs)) if pxs else None
            paper_ratio = paper[smart][pmax] / paper[base][pmax] if pmax is not None and paper[base][pmax] else math.nan
            peak_sim = max(ours[base], key=ours[base].get)
            peak_paper = max(paper[base], key=paper[base].get) if paper[base] else None
            errs = []
            for s in series:
                pts = {r["x"]: get(r["record"], m.key) * m.scale for r in recs if r["panel"] == panel and r["series"] == s}
                for x, y in ref.get((m.key, panel, s), []):
                    if x in pts and y > 0 and pts[x] > 0:
                        errs.append(abs(math.log(pts[x] / (y * fig.ref_scale))))
            errs.sort()
            med = f"{errs[len(errs) // 2]:.2f} ({len(errs)})" if errs else "–"
            where = f"x={xmax:g}" + (f" (paper x={pmax:g})" if pmax is not None and pmax != xmax else "")
            rows.append(f"| {n} | {panel} | {base} → {smart} | {sim_ratio:.2f}× ({where}) | "
                        f"{paper_ratio:.2f}× | {peak_sim:g} | {'–' if peak_paper is None else f'{peak_paper:g}'} | {med} |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
