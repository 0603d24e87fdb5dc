"""Fragments spread over two synchronizer shards; learners are given the address list."""

import contextlib

import pytest

from ddiloco.core import AlgorithmConfig
from ddiloco.learner.client import LearnerClient
from ddiloco.learner.link import SynchronizerError

from ..support.runtime import FAST, LearnerThread, synchronizer, wait_for

pytestmark = pytest.mark.timeout(120)
FOUR = AlgorithmConfig(fragments=4, sync_every=4, overlap=2)


@contextlib.contextmanager
def two_shards(task, tmp_path):
    with contextlib.ExitStack() as stack:
        shards = []
        for s in range(2):
            (tmp_path / f"s{s}").mkdir()
            shards.append(
                stack.enter_context(
                    synchronizer(task, tmp_path / f"s{s}", FOUR, shard=s, num_shards=2, tokens=2 * 30 * 64)
                )
            )
        yield shards


def test_each_shard_holds_and_merges_only_its_fragments(tiny_task, tmp_path):
    with two_shards(tiny_task, tmp_path) as shards:
        addresses = [address for _, address in shards]
        learners = [LearnerThread(tiny_task, addresses, m, step_delay=0.01) for m in range(2)]
        for t in learners:
            t.start()
        for t in learners:
            t.join(60)
            assert t.error is None, t.error
        services = [svc for svc, _ in shards]
        for svc in services:
            wait_for(lambda: svc.finished.is_set(), 10)
    plan = services[0].core.plan
    for s, svc in enumerate(services):
        owned = [p for p in range(4) if p % 2 == s]
        assert svc.core.owned == owned
        assert set(svc.core.params) == {n for p in owned for n in plan.names[p]}  # no shard carries the model
        assert svc.status()["merges"] > 0
    for t in learners:  # every fragment was updated, from whichever shard owns it
        assert all(v >= 1 for v in t.result["versions"])


def test_an_address_list_missing_a_shard_is_a_clear_error(tiny_task, tmp_path):
    with two_shards(tiny_task, tmp_path) as shards:
        client = LearnerClient(tiny_task.build_model(0), [shards[0][1]], 0, timeouts=FAST, start_timeout=10)
        with pytest.raises(ValueError, match="lacks a shard"):
            client.start()
        client.close()
        swapped = LearnerClient(tiny_task.build_model(0), [shards[0][1], shards[0][1]], 1, timeouts=FAST)
        with pytest.raises((ValueError, SynchronizerError)):
            swapped.start()
        swapped.close()
