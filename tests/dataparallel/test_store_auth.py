"""The rendezvous store listens on one address and takes only values signed with the run's secret
(issue 46): real stores on loopback, a stranger's client writing what the workers read."""

from __future__ import annotations

import datetime
import os
import stat
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from ddiloco.dataparallel.config import DataParallelConfig
from ddiloco.dataparallel.rendezvous import Coordinator, Membership
from ddiloco.dataparallel.storeauth import ForgedValue, SignedStore, read_secret, write_secret

from ..support.listeners import listeners_of


def eventually(check, seconds: float = 5.0) -> bool:  # noqa: ANN001
    """True once `check()` is, polled for at most `seconds`."""
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(check())


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2"])  # a local run's; one --sync-host address
def test_the_store_listens_on_the_address_it_was_given_only(host: str):
    coordinator = Coordinator(timeout=5, host=host)
    found = [a for a in listeners_of({os.getpid()}) if a[1] == coordinator.port]
    assert found == [(host, coordinator.port)], found  # not 0.0.0.0 or ::, which torch binds by itself
    worker = Membership(coordinator.port, slot=0, timeout=5, host=host)
    assert worker.newest() == 0  # and the workers reach it there


def test_a_stranger_without_the_secret_cannot_stop_the_run_or_name_members(tmp_path: Path):
    secret = read_secret(write_secret(tmp_path))
    coordinator = Coordinator(timeout=5, secret=secret)
    worker = Membership(coordinator.port, slot=1, timeout=5, secret=secret)
    stranger = dist.TCPStore("127.0.0.1", coordinator.port, is_master=False, timeout=datetime.timedelta(seconds=5))
    stranger.set("stop", "1")
    stranger.set("gen", "7")
    stranger.set("members/7", "[1]")
    stranger.set("failed/0", "9")
    stranger.set("formed/1", '{"world": 1}')
    assert eventually(lambda: coordinator.raw.check(["stop", "failed/0", "formed/1"]))
    assert not coordinator.stopped() and coordinator.failed_in(0) == 0 and coordinator.formed(1) is None
    assert not worker.stopped() and worker.newest() == 0  # the forged generation is not seen
    coordinator.open([0, 1])  # the launcher's own values are signed and read back
    assert worker.wait(after=0, timeout=5) == (1, [0, 1])
    worker.stop()
    assert eventually(coordinator.stopped)


def test_a_signed_value_does_not_pass_for_another_key_or_scope(tmp_path: Path):
    secret = read_secret(write_secret(tmp_path))
    raw = dist.HashStore()
    SignedStore(raw, secret, scope="pg/1/").set("0", b"addr")
    raw.set("1", raw.get("0"))  # the same signed bytes, replayed under another key
    assert SignedStore(raw, secret, scope="pg/1/").get("0") == b"addr"
    with pytest.raises(ForgedValue):
        SignedStore(raw, secret, scope="pg/1/").get("1")
    with pytest.raises(ForgedValue):
        SignedStore(raw, secret, scope="pg/2/").get("0")  # an old generation's value in a new one
    with pytest.raises(ForgedValue):
        SignedStore(raw, b"x" * 64, scope="pg/1/").get("0")


def test_the_secret_file_is_its_owners_alone_and_workers_get_its_path_not_the_secret(tmp_path: Path):
    path = write_secret(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config = DataParallelConfig(run_dir=tmp_path, workers=2, tokens=1000)
    argv = config.worker_command(0, 1234, 0.0, path)
    assert str(path) in argv and path.read_text().strip() not in " ".join(argv)
