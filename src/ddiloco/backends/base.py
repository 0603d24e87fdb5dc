"""The door every backend of `ddiloco run` is reached through.

A backend is told where to run when it is made (its own options: `cluster.sbatch.SlurmOptions`,
`cluster.skypilot_tasks.SkyOptions`, a network of hosts) and what to run when it launches (the
run's config: `launch.config.RunConfig`, or `dataparallel.config.DataParallelConfig` for the
data-parallel baselines). Then:

    launched = backend.launch(config)    # start it, or only write it (a dry run)
    report = backend.follow(launched)    # watch it to its end (Ctrl+C ends it the clean way)
    backend.stop(run_dir)                # end a run left running (--detach) or whose launcher is gone

`launch_and_follow` is the two first in one. A backend prints nothing: it says what it does through
an `Output` (the command line's prints to stderr) and returns what the run left in a `Report` (the
command line prints its table, its error, its JSON line). What the user asked wrong ends in `Refused`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from ..chaos.injector import ChaosSettings

C = TypeVar("C", contravariant=True)


class Refused(Exception):
    """What the user asked cannot be done (a bad value, a scheduler that said no): one line, exit code
    2 on the command line; `flag` names the flag to blame where the message does not."""

    def __init__(self, message: str, flag: str | None = None) -> None:
        super().__init__(message)
        self.flag = flag


@contextlib.contextmanager
def refusing(*errors: type[Exception]) -> Iterator[None]:
    """Raise `errors` met inside as `Refused`: the ones a backend counts as the user's."""
    try:
        yield
    except errors as exc:
        raise Refused(str(exc)) from exc


@dataclass
class Launched:
    """What `launch` did: the result so far (the run directory, the scripts written, the jobs
    submitted), whether there is a run to follow (not after a dry run or a detached launch), and the
    backend's own handle on it, for `follow`."""

    result: dict
    followable: bool = True
    handle: Any = None


@dataclass
class Report:
    """What a run left: `result` (the summary, the command's --json line), the `table` to print (None:
    none) and why it failed (None: it did not; the command then ends with exit code 1)."""

    result: dict
    table: dict | None = None
    error: str | None = None


class LiveView(Protocol):
    """A view redrawn in place while a local run goes on (`launch.live.render`'s rich renderables)."""

    def start(self) -> None: ...

    def update(self, view: object) -> None: ...

    def stop(self) -> None: ...


class Output(Protocol):
    """Where a backend says what it does; the command line prints it on stderr (`cli/output.py`)."""

    def say(self, text: str) -> None:
        """A line of progress, or of what was done (wrapped to the terminal)."""

    def show(self, text: str) -> None:
        """Text kept as it is, never wrapped: an address, a listing of hosts."""

    def warn(self, text: str) -> None:
        """Something failed, and the backend goes on another way."""

    def live(self) -> LiveView | None:
        """A live view for a local run, or None (no live view: --quiet)."""


class Silent:
    """An `Output` that says nothing (a library caller, a test)."""

    def say(self, text: str) -> None:
        pass

    def show(self, text: str) -> None:
        pass

    def warn(self, text: str) -> None:
        pass

    def live(self) -> LiveView | None:
        return None


class Backend(Protocol[C]):
    """One place a run can go (see the module docstring)."""

    name: str

    def launch(self, config: C) -> Launched:
        """Start the run (or only write what would start it); returns what to follow."""

    def follow(self, launched: Launched) -> Report:
        """Watch a launched run until it ends; Ctrl+C or SIGTERM ends it the clean way first."""

    def stop(self, run_dir: Path) -> dict:
        """End the run recorded in `run_dir` the clean way; returns what was stopped."""


def launch_and_follow(backend: Backend[C], config: C) -> Report:
    """Launch the run, then follow it; a run only written (dry run) or left running (detached) is not
    followed: its report is what the launch returned."""
    launched = backend.launch(config)
    return backend.follow(launched) if launched.followable else Report(launched.result)


def check_local_only(chaos: ChaosSettings) -> None:
    """Chaos that `ddiloco run` injects on one machine has no meaning on a cluster: refuse it clearly."""
    given = {
        "learner_mtbf": chaos.learner_mtbf,
        "straggle": chaos.straggle,
        "kill_synchronizer_at": chaos.kill_synchronizer_at,
        "chaos_trace": chaos.trace,
        "net_delay": chaos.net_delay_ms or None,
    }
    named = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
    if named:
        raise ValueError(f"{', '.join(named)}: local chaos only; on Slurm, preempt jobs with scontrol requeue")
