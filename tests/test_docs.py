"""The README's example runs as written."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs_under_the_launcher(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python example"
    script = tmp_path / "train.py"
    script.write_text(blocks[0] + "\nassert (grad == g.size).all()\nprint('done', g.rank)\n")
    p = subprocess.run([sys.executable, "-m", "scalefree.launch.launcher", "-n", "3", "--", sys.executable, str(script)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split("\n")[:-1]) == ["[0] done 0", "[1] done 1", "[2] done 2"]
