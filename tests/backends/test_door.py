"""The door to `ddiloco run`'s backends (`backends/base.py`), without running anything: a run only
written or left running is not followed, a backend's own errors become the user's refusals and
nothing else does, chaos that only a local run injects is named flag by flag, and the backends that
cannot stop a run from its directory say who can. The backends themselves run in tests/launch (local),
tests/cluster (Slurm), tests/skypilot and tests/dataparallel."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddiloco.backends.base import Launched, Refused, Report, Silent, check_local_only, launch_and_follow, refusing
from ddiloco.backends.dataparallel import DataParallelBackend
from ddiloco.backends.local import LocalBackend
from ddiloco.chaos.injector import ChaosSettings
from ddiloco.chaos.trace import FailureTrace, Outage


class Recording:
    """A backend that records what the door asks of it."""

    name = "recording"

    def __init__(self, followable: bool) -> None:
        self.followable, self.calls = followable, []

    def launch(self, config: str) -> Launched:
        self.calls.append(("launch", config))
        return Launched({"run_dir": config}, followable=self.followable, handle="handle")

    def follow(self, launched: Launched) -> Report:
        self.calls.append(("follow", launched.handle))
        return Report({**launched.result, "followed": True}, table={"goodput": 1.0}, error="late")

    def stop(self, run_dir: Path) -> dict:
        return {}


def test_a_launched_run_is_followed_and_one_only_written_or_left_running_is_not():
    followed = Recording(followable=True)
    report = launch_and_follow(followed, "runs/a")
    assert followed.calls == [("launch", "runs/a"), ("follow", "handle")]
    assert (report.result, report.table, report.error) == (
        {"run_dir": "runs/a", "followed": True},
        {"goodput": 1.0},
        "late",
    )
    written = Recording(followable=False)  # --dry-run, --detach
    report = launch_and_follow(written, "runs/b")
    assert written.calls == [("launch", "runs/b")]
    assert (report.result, report.table, report.error) == ({"run_dir": "runs/b"}, None, None)


def test_only_the_errors_a_backend_names_become_refusals():
    with pytest.raises(Refused, match="bad value") as refused, refusing(ValueError, KeyError):
        raise ValueError("bad value")
    assert refused.value.flag is None and isinstance(refused.value.__cause__, ValueError)
    with pytest.raises(OSError), refusing(ValueError):
        raise OSError("a failure of the machine stays one")
    assert Refused("no hosts here", flag="--network hosts").flag == "--network hosts"


def test_chaos_that_only_a_local_run_injects_is_refused_naming_each_flag():
    check_local_only(ChaosSettings(learner_down=3.0, kill_shards=(0, 1)))  # settings, not faults: fine
    trace = FailureTrace.of([Outage(down_at=1.0, learner=0, up_at=2.0)])
    with pytest.raises(ValueError) as refused:
        check_local_only(ChaosSettings(straggle=2.0, trace=trace, net_delay_ms=5.0))
    assert str(refused.value).startswith("--straggle, --chaos-trace, --net-delay: local chaos only")
    with pytest.raises(ValueError, match="^--learner-mtbf, --kill-synchronizer-at: local chaos only"):
        check_local_only(ChaosSettings(learner_mtbf=30.0, kill_synchronizer_at=4.0))


@pytest.mark.parametrize("backend", [LocalBackend(Silent()), DataParallelBackend(Silent())])
def test_a_backend_whose_launcher_holds_the_run_says_how_to_stop_it(backend, tmp_path):
    with pytest.raises(Refused, match="stopped by the `ddiloco run` that started it"):
        backend.stop(tmp_path)


def test_the_silent_output_says_nothing_and_has_no_live_view():
    out = Silent()
    out.say("a"), out.show("b"), out.warn("c")
    assert out.live() is None
