"""Freed fragment-sized tensors go back to the system in a synchronizer process (glibc)."""

import subprocess
import sys

import pytest

PROBE = r"""
import re, sys, torch
from ddiloco.synchronizer.heap import return_freed_memory
if sys.argv[1] == "fixed":
    assert return_freed_memory()
rss = lambda: int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1)) // 1024
big = torch.ones(4 << 20)  # 16 MB, mmapped; freeing it raises glibc's dynamic threshold to 16 MB
del big
before = rss()
tensors = [torch.ones(1 << 20) for _ in range(40)]  # 40 x 4 MB: from the heap once the threshold rose
del tensors[:-1]  # all but the last, which pins the top of the heap
print(rss() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_fixed_mmap_threshold_returns_freed_tensors_to_the_system():
    kept = {}
    for mode in ("dynamic", "fixed"):
        out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        kept[mode] = int(out.stdout.strip().splitlines()[-1])
    assert kept["fixed"] < 20, kept  # one 4 MB tensor and noise
    assert kept["dynamic"] > 100, kept  # glibc's default keeps what was freed (why the call exists)
