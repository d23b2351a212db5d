#!/bin/bash
# The measured runs the scale model is checked against (docs/scale-model.md), three repeats
# each, on this host (2 cores): the scale-22 R-MAT (scalefree graph rmat G --scale 22
# --edges 64M, as .npz and as a text edge list) at 1, 2, 4 ranks, and its first 8M edges
# with ids spread x8 (the sparse set-up path), into docs/results/scale-model (OUT). Then:
# python collect.py > docs/results/scale-model/check.json

here=${OUT:-$(cd "$(dirname "$0")/../../docs/results/scale-model" && pwd)}
data=${DATA:-/work/data22}  # g.npz and g.txt: scalefree graph rmat g.npz --scale 22 --edges 64M (and g.txt)
spread=${SPREAD:-/tmp/spread8-first8M.npz}
if [ ! -f "$spread" ]; then
  python -c "import numpy as np; z = np.load('$data/g.npz'); m = 1 << 23
np.savez('$spread', src=z['src'][:m] * 8, dst=z['dst'][:m] * 8)"
fi
code() {  # the code measured: the scalefree imported, its commit and uncommitted changes, the native build
  python - <<'PY'
import hashlib, os, subprocess, scalefree
root = os.path.dirname(os.path.dirname(os.path.dirname(scalefree.__file__)))
git = lambda *a: subprocess.run(["git", "-C", root, *a], capture_output=True, text=True).stdout.strip()
so = [f for f in os.listdir(os.path.dirname(scalefree.__file__)) if f.startswith("_native") and f.endswith(".so")]
print("code:", git("rev-parse", "--short", "HEAD"), "diff", hashlib.sha1(git("diff").encode()).hexdigest()[:10],
      "native", int(os.path.getmtime(os.path.join(os.path.dirname(scalefree.__file__), so[0]))) if so else None)
PY
}
rm -f "$here"/measured-*  # one code state per check: the runs of one invocation
for rep in $(seq 1 ${REPEATS:-3}); do
  for input in npz:$data/g.npz txt:$data/g.txt sparse:$spread; do
    for p in 1 2 4; do
      name=measured-${input%%:*}-$p-r$rep
      c=$(code)
      flock /tmp/bench.lock scalefree graph pagerank "${input#*:}" -n $p --tol 1e-9 --top 3 --progress \
        --json "$here/$name.json" > /dev/null 2> >(tr '\r' '\n' | grep -E '^read [0-9]+ edges|distinct edges in' > "$here/$name.log")
      rc=$?; sleep 1; echo "$c exit $rc" >> "$here/$name.log"
    done
  done
done
