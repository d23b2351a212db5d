"""Medians of the measured runs (measure.sh, in docs/results/scale-model) as the check file of
``scalefree sparse plan --pagerank --check check.json``:
python collect.py > ../../docs/results/scale-model/check.json"""

import glob
import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "docs" / "results" / "scale-model"  # the runs
INPUTS = {  # what each input is, for the model: R-MAT scale, generated edges, id spread, format
    "npz": {"format": "npz", "scale": 22, "generated": 1 << 26, "spread": 1, "ids": 1 << 22},
    "txt": {"format": "text", "scale": 22, "generated": 1 << 26, "spread": 1, "ids": 1 << 22},
    "sparse": {"format": "npz", "scale": 22, "generated": 1 << 23, "spread": 8, "ids": 1 << 25},
}


def stages(log: Path) -> dict:
    """Rank 0's read and exchange seconds from the --progress lines, and the code measured."""
    out = {}
    if log.exists():
        text = log.read_text()
        m = re.search(r"^code: (.*)$", text, re.MULTILINE)
        if m:
            out["code"] = re.sub(r" exit \d+$", "", m.group(1))
        m = re.search(r"^read \d+ edges .* in ([\d.]+) s", text, re.MULTILINE)
        if m:
            out["read_s"] = float(m.group(1))
        m = re.search(r"distinct edges in ([\d.]+) s", text)
        if m:
            out["exchange_s"] = float(m.group(1))
    return out


runs = []
for name, spec in INPUTS.items():
    for p in (1, 2, 4):
        recs = []
        for f in sorted(glob.glob(str(HERE / f"measured-{name}-{p}-r*.json"))):
            r = json.loads(Path(f).read_text())
            r.update(stages(Path(f[:-5] + ".log")))
            r["peak_rss_bytes"] = max(r["peak_rss_bytes"])
            recs.append(r)
        if not recs:
            continue
        row = dict(spec, ranks=p, cores=2, repeats=len(recs), code=sorted({r.get("code", "?") for r in recs}))
        for key in ("read_s", "exchange_s", "load_s", "setup_s", "per_iteration_s", "peak_rss_bytes"):
            vals = [r[key] for r in recs if key in r]
            if vals:
                row[key] = statistics.median(vals)
                row[key + "_range"] = [min(vals), max(vals)]
        runs.append(row)
print(json.dumps(runs, indent=1))
