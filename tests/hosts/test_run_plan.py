"""`--network hosts --link ...` checked before anything is made: the syntax, each refusal by name, and
the reason when this machine cannot make hosts (these need no root)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ddiloco.hosts import LinkSpec
from ddiloco.hosts.run import HostsPlan, host_of


def test_one_spec_is_every_learners_link_and_a_named_one_overrides():
    plan = HostsPlan.parse(["latency=80ms,rate=1gbit", "learner1=rate=10mbit", "sync0=latency=1ms"], 3, 2)
    assert plan.names == ["launcher", "sync0", "sync1", "learner0", "learner1", "learner2"]
    assert plan.links["learner0"] == plan.links["learner2"] == LinkSpec.parse("latency=80ms,rate=1gbit")
    assert plan.links["learner1"] == LinkSpec.parse("rate=10mbit")  # not merged with the default: its own
    assert plan.links["sync0"] == LinkSpec.parse("latency=1ms") and "sync1" not in plan.links
    assert HostsPlan.parse([], 2, 1).links == {}  # every link unshaped
    assert host_of("sync-1") == "sync1" and host_of("learner-12") == "learner12"


@pytest.mark.parametrize(
    ("values", "words"),
    [
        (["learner2=rate=1mbit"], "no host 'learner2'; hosts are learner0..learner1 and sync0..sync0"),
        (["sync1=rate=1mbit"], "no host 'sync1'"),
        (["laptop=rate=1mbit"], "no host 'laptop'"),
        (["rate=1mbit", "latency=2ms"], "every learner's link is given twice"),
        (["learner0=rate=1mbit", "learner0=rate=2mbit"], "host learner0's link is given twice"),
        (["latency=80"], "latency '80'"),
        (["learner0=speed=1mbit"], "unknown key 'speed'"),
        (["loss=0.1"], "a percentage"),
    ],
)
def test_bad_links_are_refused_by_name(values: list[str], words: str):
    with pytest.raises(ValueError, match="--link") as e:
        HostsPlan.parse(values, 2, 1)
    assert words in str(e.value)


def _run(*args: str, uid: int | None = None) -> tuple[int, str]:
    """`ddiloco run ...` in a process of its own (as `uid`, as far as os.geteuid tells): code and stderr."""
    fake = f"import os; os.geteuid = lambda: {uid}; " if uid is not None else ""
    code = fake + "import sys; from ddiloco.cli import main; sys.argv[0] = 'ddiloco'; main()"
    argv = [sys.executable, "-c", code, "run", "--tokens", "1000", "--model-size", "tiny", "--seq-len", "16", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "500"})
    return done.returncode, done.stderr


def test_the_cli_refuses_links_without_hosts_and_hosts_without_root(tmp_path):
    code, out = _run("--link", "rate=1mbit", "--run-dir", str(tmp_path / "a"))
    assert code == 2 and "only with --network hosts" in out
    code, out = _run("--network", "hosts", "--run-dir", str(tmp_path / "b"), uid=1000)
    assert code == 2 and "network namespaces need root (effective uid is 1000)" in out
    code, out = _run("--network", "hosts", "--link", "sync3=rate=1mbit", "--run-dir", str(tmp_path / "c"), uid=1000)
    assert code == 2 and "need root" in out  # the reason first: no link can be made anyway


def test_the_cli_refuses_hosts_with_an_emulated_link_or_another_backend(tmp_path):
    code, out = _run("--network", "hosts", "--net-latency", "50", "--run-dir", str(tmp_path / "a"))
    assert code == 2 and "emulate" in out
    code, out = _run("--network", "hosts", "--backend", "slurm", "--run-dir", str(tmp_path / "b"))
    assert code == 2 and "--backend local" in out
    code, out = _run("--network", "hosts", "--method", "ddp", "--backend", "slurm", "--run-dir", str(tmp_path / "c"))
    assert code == 2 and "--backend local" in out
    # the data-parallel workers run on hosts learner0.. (docs/dataparallel.md); there is no synchronizer host
    with pytest.raises(ValueError, match=r"no host 'sync0'; hosts are learner0..learner3 \(or"):
        HostsPlan.parse(["sync0=rate=1mbit"], 4, 0)
