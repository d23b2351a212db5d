"""Every simulated host sends to the next at once for 2 s with one TCP floor method per run
(spec HOSTS:STREAMS:write|splice|zc); prints GB/s per host. Needs /tmp/hb/fl built from
tcp_floor_methods.c; run as root (simulated hosts)."""
import subprocess, sys, time
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), "../../python"))
from scalefree.launch.simhosts import SimHosts
def run(nh, ns, method, secs=2.0, blk=1<<20, sndbuf=0):
    with SimHosts(nh) as sim:
        port = 5000
        rx = [subprocess.Popen(sim.command(i, ["/tmp/hb/fl", "rx", str(port), str(ns)]), stdout=subprocess.PIPE, text=True) for i in range(nh)]
        time.sleep(0.5)
        t0 = time.monotonic()
        tx = [subprocess.Popen(sim.command(i, ["/tmp/hb/fl", "tx", sim.ip((i+1)%nh), str(port), str(ns), method, str(secs), str(blk), str(sndbuf)])) for i in range(nh)]
        for t in tx: t.wait()
        el = time.monotonic() - t0
        tot = 0
        for r in rx:
            out = r.communicate()[0].split()
            tot += sum(int(x) for x in out)
        return tot / max(el, secs) / 1e9 / nh
for spec in sys.argv[1:]:
    nh, ns, m, *rest = spec.split(":")
    blk = int(rest[0]) if rest else 1<<20
    sb = int(rest[1]) if len(rest) > 1 else 0
    print(spec, f"{run(int(nh), int(ns), m, blk=blk, sndbuf=sb):.2f} GB/s per host", flush=True)
