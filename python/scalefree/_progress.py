"""Progress on stderr, one way for every command: a tqdm bar on a terminal; in a log (stderr
not a terminal) a plain line every ``every`` seconds and one at the end, so log files get
no carriage-return frames."""

from __future__ import annotations

import sys
import time


class _Lines:
    """tqdm's small surface (update, set_postfix_str, close; total and n writable) as lines."""

    def __init__(self, total, desc: str, unit: str, every: float):
        self.total, self.n, self.desc, self.unit, self.every = total, 0, desc, unit, every
        self.postfix = ""
        self.t0 = self.last = time.perf_counter()

    def update(self, k=1) -> None:
        self.n += k
        self.refresh()

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text
        if refresh:
            self.refresh()

    def refresh(self, final: bool = False) -> None:
        now = time.perf_counter()
        if not final and now - self.last < self.every:
            return
        self.last = now
        of = f"/{self.total:g}" if self.total else ""
        tail = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.n:g}{of}{self.unit}{tail}, {now - self.t0:.1f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.refresh(final=True)


def bar(total=None, desc: str = "", unit: str = "", *, show: bool = True, unit_scale: bool = False,
        every: float = 5.0, leave: bool = True):
    """A progress bar (tqdm on a terminal, lines otherwise), or one that shows nothing when
    ``show`` is false. Use as tqdm: ``update(n)``, ``set_postfix_str(s)``, ``close()``."""
    if show and sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=sys.stderr, leave=leave)
    if show:
        return _Lines(total, desc, unit, every)
    from tqdm import tqdm

    return tqdm(total=total, disable=True)
