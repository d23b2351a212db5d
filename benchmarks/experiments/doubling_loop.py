"""Small allreduces in a loop across simulated hosts, per-call medians and per-thread
context switches per rank: the experiment behind "own reads" (the git history of docs/benchmarks.md, across
simulated hosts, Latest). Run as root from the repository root:

    python3 benchmarks/experiments/doubling_loop.py HOSTS [--per-host P] [--bytes B] [--calls N] [--barrier]
    python3 benchmarks/experiments/doubling_loop.py 4 --c MODE     # the C yardstick (doubling_c.c)

Environment variables of the scalefree run (SCALEFREE_OWN_READS=0, SCALEFREE_SPIN_US, ...)
pass through to the ranks. Each rank prints its median, the 5/20/35/50/65/80/95th percentiles
("q", µs) and its threads' CPU ticks and context switches. LOOP_PIN=1 pins every thread of
the rank on host i to core i % 2 (an experiment on thread placement, not something the
library does)."""
import argparse, json, os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../../python"))

RANK = r'''
import os, sys, time, json, numpy as np, scalefree
g = scalefree.init()
if os.environ.get("LOOP_PIN") == "1":
    for t in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(t), {g.rank % 2})
a = np.ones(int(os.environ["LOOP_BYTES"]) // 4, dtype=np.float32)
def threads():
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            name = open(f"/proc/self/task/{t}/comm").read().strip()
            st = open(f"/proc/self/task/{t}/stat").read().split(")")[-1].split()
            cs = dict(l.split(":") for l in open(f"/proc/self/task/{t}/status").read().splitlines() if "ctxt" in l)
            out[t] = (name, int(st[11]) + int(st[12]), int(cs["voluntary_ctxt_switches"]), int(cs["nonvoluntary_ctxt_switches"]))
        except (OSError, KeyError, ValueError):
            pass
    return out
for _ in range(200):
    g.allreduce(a)
g.barrier()
n, barrier = int(os.environ["LOOP_CALLS"]), os.environ["LOOP_BARRIER"] == "1"
before, ts = threads(), np.zeros(n)
for i in range(n):
    if barrier:
        g.barrier()
    t0 = time.perf_counter(); g.allreduce(a); ts[i] = time.perf_counter() - t0
after = threads()
per = {}
for t, (name, ticks, vol, inv) in after.items():
    b = before.get(t, (name, 0, 0, 0))
    k = name.rstrip("0123456789-")
    x = per.setdefault(k, [0, 0, 0])
    x[0] += ticks - b[1]; x[1] += vol - b[2]; x[2] += inv - b[3]
print("LOOP " + json.dumps({"rank": g.rank, "median_us": float(np.median(ts)) * 1e6, "p10_us": float(np.percentile(ts, 10)) * 1e6,
      "p90_us": float(np.percentile(ts, 90)) * 1e6, "q": [round(float(x)*1e6) for x in np.percentile(ts, [5,20,35,50,65,80,95])], "threads (cpu ticks, voluntary, involuntary switches)": {k: v for k, v in per.items() if any(v)}}), flush=True)
g.close()
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("hosts", type=int)
    p.add_argument("--per-host", type=int, default=1)
    p.add_argument("--bytes", type=int, default=1024)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--barrier", action="store_true", help="a barrier before every timed call (as the bench does)")
    p.add_argument("--c", type=int, metavar="MODE", help="run the C yardstick instead (needs cc)")
    a = p.parse_args()
    from scalefree.launch import simhosts
    from scalefree_bench import common, hosts as across
    with simhosts.SimHosts(a.hosts) as sim, tempfile.TemporaryDirectory() as tmp:
        if a.c is not None:
            exe = os.path.join(tmp, "doubling_c")
            subprocess.run(["cc", "-O2", "-o", exe, os.path.join(HERE, "doubling_c.c")], check=True)
            ips = [sim.ip(i) for i in range(a.hosts)]
            procs = [sim.popen(i, [exe, str(i), str(a.hosts), str(a.c), str(a.calls), str(a.bytes), *ips], stdout=subprocess.PIPE, text=True)
                     for i in range(a.hosts)]
            for q in procs:
                print(q.communicate()[0].strip())
            return 0
        script = os.path.join(tmp, "rank.py")
        with open(script, "w") as f:
            f.write(RANK)
        env = {"LOOP_BYTES": str(a.bytes), "LOOP_CALLS": str(a.calls), "LOOP_BARRIER": "1" if a.barrier else "0"}
        cmds = across.scalefree_cmds(sim, a.per_host, sim.port(), [sys.executable, script])
        os.environ.update(env)
        out = across.run_all(cmds, timeout_s=600)
        return 0 if out.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
