"""How the ``scalefree flash`` commands report a run: sizes, and one summary line of the
runtime's counters (bytes read and written, cache hits, compute idle, peak resident)."""

from __future__ import annotations


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 28 else f"{n / (1 << 20):.1f} MiB"


def summary(what: str, stats: dict, seconds: float, rt, extra: str = "", blas: bool = True) -> str:
    read, written = stats.get("bytes_read", 0), stats.get("bytes_written", 0)
    hits, misses = stats.get("cache_hits", 0), stats.get("cache_misses", 0)
    hit_rate = hits / (hits + misses) if hits + misses else 0.0
    gbps = (read + written) / seconds / 1e9 if seconds > 0 else 0.0
    return (f"{what}: {seconds:.2f} s{extra}; read {read} bytes, wrote {written} bytes ({gbps:.2f} GB/s); "
            f"cache hit rate {hit_rate:.1%} ({hits} hits, {misses} misses); compute idle "
            f"{stats.get('compute_idle_seconds', 0.0):.2f} s; peak {stats.get('peak_resident_bytes', 0)} of "
            f"{rt.memory_budget_bytes} bytes" + (f"; block BLAS {rt.blas or 'faer'}" if blas else ""))
