"""Files that appear whole or not at all: write to a temporary name beside the target,
rename onto it on success, remove it on failure."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path):
    """Yields a temporary path beside ``path`` (same directory, same last suffix, so writers
    that go by the extension behave the same); renames it onto ``path`` when the block ends
    without an exception, and removes it otherwise."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json(path, doc) -> None:
    """Writes ``doc`` as indented JSON to ``path``, atomically (a command's ``--json``)."""
    import json

    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
