# Degree histograms of the distinct edges of the scale-22 R-MAT (for the scale model):
# python degrees.py rmat22-degrees.json (then "generated": 2**26 was added by hand).
import json
import sys

import numpy as np

z = np.load("/work/data22/g.npz")
src = z["src"].astype(np.uint64); dst = z["dst"].astype(np.uint64)
n = int(max(src.max(), dst.max())) + 1
key = np.unique(src << np.uint64(32) | dst)
del src, dst
s = (key >> np.uint64(32)).astype(np.int64); d = (key & np.uint64(0xffffffff)).astype(np.int64)
del key
outd = np.bincount(s, minlength=n); ind = np.bincount(d, minlength=n)
loop = s == d
tot = outd + ind - np.bincount(s[loop], minlength=n)  # distinct incident edges (a self-loop once)
def hist(a):
    v, c = np.unique(a[a > 0], return_counts=True)
    return [[int(x), int(y)] for x, y in zip(v, c)]
rec = {"graph": "R-MAT scale 22, 2**26 generated edges, seed 0 (scalefree graph rmat), duplicates dropped",
       "ids": n, "edges": len(s), "vertices": int((tot > 0).sum()),
       "total": hist(tot), "out": hist(outd), "in": hist(ind)}
with open(sys.argv[1], "w") as f:
    json.dump(rec, f, separators=(",", ":"))
print(n, len(s), rec["vertices"], len(rec["total"]), len(rec["out"]), len(rec["in"]))
