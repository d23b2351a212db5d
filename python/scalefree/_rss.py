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


def _libc():
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def return_freed_memory() -> bool:
    """Makes the C allocator hand large freed blocks back to the system (glibc: a fixed
    ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` of 128 KiB). By default glibc raises its
    mmap threshold up to 32 MiB after the first large block is freed, so later arrays below
    that size come from the heap and stay resident after they are freed: a command that works
    in row blocks of a few MiB then grows past its memory budget. It also gives every thread
    that allocates (the flash runtime's compute and IO threads) an arena of its own, whose
    freed small blocks are not trimmed with the main heap (measured: 30 MiB held by one such
    arena after ``flash topics`` on 1M documents); ``M_ARENA_MAX`` = 1 keeps them all in the
    main heap, which :func:`trim_heap` and the trim threshold return. Call it before the
    threads start. For the commands whose ``--memory`` bounds the whole process (``flash
    svd``, ``flash topics``); False where not glibc."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
    return bool(mallopt(m_mmap_threshold, 128 << 10)) and bool(mallopt(m_trim_threshold, 128 << 10)) \
        and bool(mallopt(m_arena_max, 1))


def trim_heap() -> None:
    """Give free C-heap memory back to the system (glibc ``malloc_trim``: free pages inside
    the heaps too, not only at their top; no-op elsewhere)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)
