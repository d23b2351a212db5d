"""This process's resident memory, as the kernel counts it (the one RSS reader)."""

from __future__ import annotations


def status_bytes(field: str) -> int | None:
    """A byte count of ``/proc/self/status`` (``VmRSS``, ``VmHWM``...), or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss_bytes() -> int:
    """This process's resident-set high-water mark (VmHWM; since the last :func:`reset_peak_rss`)."""
    v = status_bytes("VmHWM")
    if v is not None:
        return v
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Restart the high-water mark from the current RSS (Linux ≥ 4.0); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
