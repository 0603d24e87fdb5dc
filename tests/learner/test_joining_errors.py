"""Joining a run when the shards' replies disagree or are bad, when the global values do not come, and
the learner's journal when it is misused or its files are damaged."""

from __future__ import annotations

import dataclasses
import json
import queue
import time

import pytest
import torch

from ddiloco.core import AlgorithmConfig, FragmentRequest, FragmentUpdate, plan_for_model
from ddiloco.learner.joining import await_global, check_replies, make_core
from ddiloco.learner.journal import RECORD_BYTES, Journal, read_journals
from ddiloco.learner.link import SynchronizerError
from ddiloco.wire.protocol import plan_to_json

pytestmark = pytest.mark.timeout(30)

ADDRESSES = ["127.0.0.1:7001", "127.0.0.1:7002"]


def model_params():
    return {"a.weight": torch.zeros(4, 3), "a.bias": torch.zeros(4), "b.weight": torch.zeros(2, 4)}


def replies(params=None, config=None, owned=((0,), (1,))):
    params = params or model_params()
    config = config or AlgorithmConfig(fragments=2, sync_every=4, overlap=1)
    plan = plan_to_json(plan_for_model(params, 2), params)
    algorithm = dataclasses.asdict(config)
    return [{"plan": plan, "algorithm": dict(algorithm), "owned": list(o)} for o in owned]


def test_agreeing_shards_give_the_plan_the_algorithm_and_each_fragments_owner():
    plan, config, owner = check_replies(ADDRESSES, replies(), model_params())
    assert plan.num_fragments == 2
    assert config == AlgorithmConfig(fragments=2, sync_every=4, overlap=1)
    assert owner == {0: 0, 1: 1}


def test_a_shard_with_another_algorithm_is_refused_naming_both_addresses():
    bad = replies()
    bad[1]["algorithm"]["sync_every"] = 8
    with pytest.raises(
        SynchronizerError, match=r"127\.0\.0\.1:7002 runs a different plan or algorithm than 127\.0\.0\.1:7001"
    ):
        check_replies(ADDRESSES, bad, model_params())


def test_a_shard_with_another_plan_is_refused():
    bad = replies()
    bad[1]["plan"] = replies(params={**model_params(), "c": torch.zeros(5)})[1]["plan"]
    with pytest.raises(SynchronizerError, match="different plan or algorithm"):
        check_replies(ADDRESSES, bad, model_params())


def test_a_parameter_of_another_shape_is_refused_naming_it():
    params = model_params()
    params["a.bias"] = torch.zeros(5)
    with pytest.raises(
        SynchronizerError, match=r"model parameter 'a\.bias' does not match the synchronizer's shape \(4,\)"
    ):
        check_replies(ADDRESSES, replies(), params)


def test_a_parameter_the_model_lacks_is_refused_naming_it():
    params = model_params()
    del params["b.weight"]
    with pytest.raises(SynchronizerError, match=r"model parameter 'b\.weight'"):
        check_replies(ADDRESSES, replies(), params)


def test_a_fragment_owned_by_two_shards_is_refused():
    with pytest.raises(ValueError, match=r"fragment 1 is owned by shards 0 and 1"):
        check_replies(ADDRESSES, replies(owned=((0, 1), (1,))), model_params())


def test_a_fragment_owned_by_no_shard_is_refused():
    with pytest.raises(ValueError, match=r"no synchronizer shard owns fragments \[1\]"):
        check_replies(ADDRESSES, replies(owned=((0,), ())), model_params())


def update(fragment, version):
    return FragmentUpdate(fragment, version, {"x": torch.full((1,), float(version))}, (0,))


def test_the_newest_value_of_every_fragment_and_the_requests_meanwhile_are_returned():
    inbound: queue.Queue = queue.Queue()
    request = FragmentRequest(1, 0, (0, 1))
    for event in [
        ("update", 0, update(0, 1)),
        ("request", 0, request),
        ("update", 0, update(0, 3)),
        ("update", 0, update(0, 2)),  # older than what came: not taken
        ("heartbeat", 0, None),  # anything else is ignored
        ("update", 1, update(1, 0)),
    ]:
        inbound.put(event)
    updates, requests = await_global(inbound, 2, time.monotonic() + 10)
    assert {u.fragment: u.version for u in updates} == {0: 3, 1: 0}
    assert requests == [request]


def test_a_fatal_event_while_waiting_is_raised_with_its_reason():
    inbound: queue.Queue = queue.Queue()
    inbound.put(("update", 0, update(0, 1)))
    inbound.put(("fatal", 1, "synchronizer 127.0.0.1:7002 refused the token"))
    with pytest.raises(SynchronizerError, match="refused the token"):
        await_global(inbound, 2, time.monotonic() + 5)  # bounded: a fatal event that were ignored would time out


def test_fragments_that_never_come_time_out_saying_how_many_arrived():
    inbound: queue.Queue = queue.Queue()
    inbound.put(("update", 0, update(0, 1)))
    inbound.put(("update", 0, update(0, 2)))  # the same fragment twice counts once
    with pytest.raises(ConnectionError, match=r"\(1 of 2 fragments arrived\)"):
        await_global(inbound, 2, time.monotonic() + 0.3)  # bounded: 0.3 s, then the error


def test_a_deadline_already_passed_times_out_at_once_without_reading():
    inbound: queue.Queue = queue.Queue()
    inbound.put(("update", 0, update(0, 1)))
    with pytest.raises(ConnectionError, match=r"\(0 of 1 fragments arrived\)"):
        await_global(inbound, 1, time.monotonic() - 1.0)
    assert inbound.qsize() == 1


def test_a_sharded_learner_overwrites_with_a_warning_where_the_run_rebases(caplog):
    params = model_params()
    plan = plan_for_model(params, 2)
    config = AlgorithmConfig(fragments=2, sync_every=4, overlap=1, arrival="rebase")
    with caplog.at_level("WARNING"):
        assert make_core(0, params, plan, config, sharded=True).rebase is False
    assert "arrival 'rebase' is not supported with FSDP" in caplog.text
    assert make_core(0, params, plan, config, sharded=False).rebase is True
    overwrite = dataclasses.replace(config, arrival="overwrite")
    assert make_core(0, params, plan, overwrite, sharded=True) is not None


def test_a_journal_write_after_close_is_ignored_and_the_last_record_kept(tmp_path):
    journal = Journal(tmp_path / "j" / "journal-0.json")
    journal.write({"tokens": 10})
    journal.close()
    journal.close()  # twice is harmless
    journal.write({"tokens": 99})
    assert list(read_journals(tmp_path)) == [{"tokens": 10}]


def test_a_record_too_large_is_refused_and_the_previous_one_kept(tmp_path):
    journal = Journal(tmp_path / "journal-0.json")
    journal.write({"tokens": 10})
    with pytest.raises(ValueError, match="journal record too large"):
        journal.write({"blob": "x" * RECORD_BYTES})
    journal.close()
    assert list(read_journals(tmp_path)) == [{"tokens": 10}]
    assert (tmp_path / "journal-0.json").stat().st_size == RECORD_BYTES


def test_a_record_of_exactly_the_record_size_is_written(tmp_path):
    record = {"blob": ""}
    record["blob"] = "x" * (RECORD_BYTES - len(json.dumps(record, separators=(",", ":"))))
    journal = Journal(tmp_path / "journal-0.json")
    journal.write(record)
    journal.close()
    assert list(read_journals(tmp_path)) == [record]


def test_damaged_or_unreadable_journals_are_skipped_and_empty_ones_read_as_empty(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "journal-1.json").write_bytes(b'{"tokens": 5}' + b" " * 20)
    (tmp_path / "a" / "journal-2.json").write_bytes(b'{"tokens": ')  # torn write
    (tmp_path / "a" / "journal-3.json").mkdir()  # not a file: reading it fails
    (tmp_path / "journal-4.json").write_bytes(b"   ")  # created, never written
    assert list(read_journals(tmp_path)) == [{"tokens": 5}, {}]
