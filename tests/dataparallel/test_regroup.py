"""A survivor whose last join failed forms the next generation with a freshly started peer: real
processes, a real store and gloo on loopback (the elastic baseline stalled for good without this)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from ddiloco.dataparallel.launcher import local_env
from ddiloco.dataparallel.rendezvous import Coordinator

# argv: store port, slot, then "generation:rank:world:timeout" per join to try, in order. Each join
# that forms all-reduces a one and prints "formed G SUM"; one that fails prints "failed G".
WORKER = textwrap.dedent(
    """
    import sys
    import torch, torch.distributed as dist
    from ddiloco.dataparallel.rendezvous import Membership, leave_group
    m = Membership(int(sys.argv[1]), int(sys.argv[2]), timeout=30.0)
    for spec in sys.argv[3:]:
        generation, rank, world, timeout = spec.split(":")
        try:
            m.form(int(generation), int(rank), int(world), "gloo", float(timeout))
            x = torch.ones(1)
            dist.all_reduce(x)
            print("formed", generation, int(x.item()), flush=True)
        except Exception as exc:
            print("failed", generation, type(exc).__name__, flush=True)
        finally:
            leave_group()
    """
)


def run(port: int, slot: int, *joins: str) -> subprocess.Popen:
    cmd = [sys.executable, "-c", WORKER, str(port), str(slot), *joins]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=local_env())


def test_a_survivor_of_a_failed_join_forms_the_next_generation_with_a_fresh_peer():
    coordinator = Coordinator(timeout=30.0)
    # Generation 1 names a peer that never arrives (killed before it joined): the survivor's join
    # times out. Generation 2 names the survivor and a peer started afresh; both must form it.
    survivor = run(coordinator.port, 0, "1:0:2:2", "2:0:2:60")
    try:
        first = survivor.stdout.readline().split()
        assert first[:2] == ["failed", "1"], first
        fresh = run(coordinator.port, 1, "2:1:2:60")
        try:
            out_fresh, err_fresh = fresh.communicate(timeout=120)
        finally:
            fresh.kill()
        out_survivor, err_survivor = survivor.communicate(timeout=120)
    finally:
        survivor.kill()
    assert out_survivor.split() == ["formed", "2", "2"], err_survivor[-2000:]
    assert out_fresh.split() == ["formed", "2", "2"], err_fresh[-2000:]
