"""`import scalefree.torch` fills in torch's env:// variables under `scalefree run` (as for
mpirun and srun), so init_process_group("scalefree") works unchanged there too."""

import subprocess
import sys

CODE = """
import torch, torch.distributed as dist
import scalefree.torch
dist.init_process_group("scalefree")
t = torch.ones(5)
dist.all_reduce(t)
print("ok", dist.get_rank(), dist.get_world_size(), t[0].item())
dist.destroy_process_group()
"""


def test_scalefree_run(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(CODE)
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    p = subprocess.run([sys.executable, "-m", "scalefree.cli", "run", "-n", "2", "--", sys.executable,
                        str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(line for line in p.stdout.splitlines() if " ok " in line) == ["[0] ok 0 2 2.0", "[1] ok 1 2 2.0"]
