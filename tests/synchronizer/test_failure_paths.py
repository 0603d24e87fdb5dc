"""Failure paths of the synchronizer's helpers: a merge that raises, a `finish` that raises, settings
that are refused with the bad value named, and glibc's allocator tuning where it is unavailable."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from dataclasses import dataclass

import pytest

from ddiloco.core.merge_job import MergeResult
from ddiloco.synchronizer import heap
from ddiloco.synchronizer.merger import MergeWorkers
from ddiloco.synchronizer.settings import ServiceSettings

pytestmark = pytest.mark.timeout(30)


@dataclass
class FakeJob:
    fragment: int
    version: int
    error: Exception | None = None

    def compute(self) -> MergeResult:
        if self.error is not None:
            raise self.error
        return MergeResult({}, 1.5)


def run_jobs(finish, jobs, threads=1):
    workers = MergeWorkers(finish, threads)
    for job in jobs:
        workers.submit(job)
    workers.close()  # waits for every submitted job: no sleeps, no polling


def test_a_merge_that_raises_is_finished_as_a_refused_round_naming_the_error():
    finished: list[tuple[FakeJob, MergeResult, float]] = []
    job = FakeJob(2, 5, RuntimeError("boom"))
    run_jobs(lambda j, r, s: finished.append((j, r, s)), [job])
    assert len(finished) == 1  # the fragment is released, not left busy forever
    got_job, result, seconds = finished[0]
    assert got_job is job
    assert result.error == "the merge failed: RuntimeError: boom"
    assert result.scaled == {}  # nothing to apply: the global value stays as it was
    assert result.merged_norm == 0.0
    assert seconds >= 0.0


def test_a_merge_that_raises_is_logged_with_its_fragment_and_version(caplog):
    with caplog.at_level(logging.ERROR, logger="ddiloco.synchronizer.merger"):
        run_jobs(lambda j, r, s: None, [FakeJob(3, 9, ValueError("bad sum"))])
    messages = [r.getMessage() for r in caplog.records]
    assert "merge of fragment 3 version 9 failed" in messages
    assert any(r.exc_info and r.exc_info[0] is ValueError for r in caplog.records)


def test_a_finish_that_raises_is_logged_and_later_merges_are_still_finished(caplog):
    finished: list[int] = []
    lock = threading.Lock()

    def finish(job, result, seconds):
        if job.fragment == 0:
            raise KeyError("lost session")
        with lock:
            finished.append(job.fragment)

    with caplog.at_level(logging.ERROR, logger="ddiloco.synchronizer.merger"):
        run_jobs(finish, [FakeJob(0, 1), FakeJob(1, 1), FakeJob(2, 4)])
    assert sorted(finished) == [1, 2]
    assert "finishing the merge of fragment 0 version 1 failed" in [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"checkpoint_every": -1}, r"checkpoint_every must be >= 0"),
        ({"codec_down": "fp8"}, r"codec_down must be one of .* got 'fp8'"),
        ({"budget_counts": "seen"}, r"budget_counts must be one of .* got 'seen'"),
        ({"keep_versions": 0}, r"keep_versions must be in \[1, 1000\], got 0"),
        ({"keep_versions": 1001}, r"keep_versions must be in \[1, 1000\], got 1001"),
        ({"workers": 8}, r"workers must exceed reserved_control_workers"),
        ({"workers": 4, "reserved_control_workers": 4}, r"workers must exceed reserved_control_workers"),
        ({"max_learners": 0}, r"max_learners must be in \[1, 1048576\], got 0"),
        ({"max_learners": 2**20 + 1}, r"max_learners must be in \[1, 1048576\], got 1048577"),
    ],
)
def test_bad_service_settings_are_refused_naming_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ServiceSettings(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"checkpoint_every": 0},
        {"keep_versions": 1},
        {"keep_versions": 1000},
        {"max_learners": 1},
        {"max_learners": 2**20},
        {"workers": 9},
    ],
)
def test_service_settings_at_the_edges_are_accepted(kwargs):
    settings = ServiceSettings(**kwargs)
    for name, value in kwargs.items():
        assert getattr(settings, name) == value


def test_default_workers_follow_max_learners():
    assert ServiceSettings(max_learners=3).workers == 6 * 3 + 16  # a subscribe, 4 pushes, a fetch each


class FakeLibc:
    def __init__(self, answers):
        self.answers = dict(answers)
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, param, value):
        self.calls.append((param, value.value))
        return self.answers[param]


def test_without_a_c_library_the_heap_is_left_alone(monkeypatch):
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: pytest.fail("no library to load"))
    assert heap.return_freed_memory() is False


@pytest.mark.parametrize("error", [OSError("cannot load"), AttributeError("no mallopt")])
def test_a_c_library_that_cannot_be_loaded_or_lacks_mallopt_is_not_an_error(monkeypatch, error):
    def fail(name):
        raise error

    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libc-fake.so")
    monkeypatch.setattr(ctypes, "CDLL", fail)
    assert heap.return_freed_memory() is False


@pytest.mark.parametrize(
    ("threshold_ok", "arenas_ok", "expected"), [(1, 1, True), (0, 1, False), (1, 0, False), (0, 0, False)]
)
def test_a_refused_mallopt_is_reported_and_both_settings_are_still_tried(
    monkeypatch, caplog, threshold_ok, arenas_ok, expected
):
    libc = FakeLibc({heap.M_MMAP_THRESHOLD: threshold_ok, heap.M_ARENA_MAX: arenas_ok})
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libc-fake.so")
    monkeypatch.setattr(ctypes, "CDLL", lambda name: libc)
    with caplog.at_level(logging.DEBUG, logger="ddiloco.synchronizer.heap"):
        assert heap.return_freed_memory(threshold=12345, arenas=3) is expected
    assert libc.calls == [(heap.M_MMAP_THRESHOLD, 12345), (heap.M_ARENA_MAX, 3)]
    refused = "mallopt refused the mmap threshold or the arena count" in [r.getMessage() for r in caplog.records]
    assert refused is (not expected)
