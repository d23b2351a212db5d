# T(P) of the real scale-22 graph under the real edge_owner hash, ranks 0 and P-1:
# python touched.py touched-rmat22.json
import json
import sys

import numpy as np
from scalefree.graph.io import edge_owner

z = np.load("/work/data22/g.npz")
key = np.unique(z["src"].astype(np.uint64) << np.uint64(32) | z["dst"].astype(np.uint64))
s = (key >> np.uint64(32)).astype(np.int64); d = (key & np.uint64(0xffffffff)).astype(np.int64); del key
n = 1 << 22
out = {}
for P in (1, 2, 4, 16, 64, 256):
    own = edge_owner(s, d, P)
    rows = []
    for r in sorted({0, P - 1}):
        m = own == r
        tot = np.zeros(n, bool); tot[s[m]] = True; src_t = tot.copy(); tot[d[m]] = True
        dt = np.zeros(n, bool); dt[d[m]] = True
        rows.append({"rank": r, "edges": int(m.sum()), "touched": int(tot.sum()), "sources": int(src_t.sum()), "targets": int(dt.sum())})
    out[P] = rows
    print(P, rows, flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
