"""Every relative link in the Markdown docs (README, docs/, benchmarks/) points at a file or
folder of the repository, and so does every repository path named in the text (outside
backticks: a path in backticks may name one that is gone, as in "the git history of
`docs/benchmarks.md`")."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(r"(?<![\w./-])(?:docs|benchmarks|python|tests|crates|scripts)/[\w./-]*\.(?:md|py|rs|toml|sh)\b")
CODE = re.compile(r"`[^`]*`")


def _pages():
    yield from sorted(REPO.glob("*.md"))
    for folder in ("docs", "benchmarks"):
        yield from sorted((REPO / folder).rglob("*.md"))


def test_relative_links_resolve():
    dead = []
    for page in _pages():
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue  # a URL, or an anchor on the same page
                path = target.split("#", 1)[0]
                if not (page.parent / path).exists():
                    dead.append(f"{page.relative_to(REPO)}:{n}: {target}")
            for path in PATH.findall(LINK.sub("", CODE.sub("", line))):
                if not (REPO / path).exists():
                    dead.append(f"{page.relative_to(REPO)}:{n}: {path}")
    assert not dead, "dead links:\n" + "\n".join(dead)
