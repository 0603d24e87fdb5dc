"""`ddiloco.end_ranks`: a learner process's last line under torchrun, as its own process here."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

GROUP = r"""
import sys, torch, torch.distributed as dist, ddiloco
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
t = torch.ones(4)
dist.broadcast(t, 0)
print("trained", flush=False)  # end_ranks flushes it
ddiloco.end_ranks(int(sys.argv[2]))
print("never")
"""


@pytest.mark.parametrize("code", [0, 3])
def test_a_rank_leaves_its_group_flushes_and_ends_with_its_code(tmp_path, code):
    out = subprocess.run(
        [sys.executable, "-c", GROUP, str(tmp_path / "store"), str(code)], capture_output=True, text=True, timeout=100
    )
    assert out.returncode == code, out.stderr[-2000:]
    assert out.stdout.split() == ["trained"]


def test_without_a_group_it_only_flushes_and_exits():
    out = subprocess.run(
        [sys.executable, "-c", "import ddiloco; print('done', end=''); ddiloco.end_ranks(0); print('never')"],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0 and out.stdout == "done"
