"""Shared fixtures: the tinyshakespeare corpus from the workspace's shared data folder (never copied),
and a process table whose children are all ended, by PID, when a test ends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

try:  # pytest >= 9.2 builds `nodeid` from `item._id` (below: the xdist group)
    from _pytest.nodeid import coerce_node_id
except ImportError:  # older pytest reads the `_nodeid` xdist sets
    coerce_node_id = None  # type: ignore[assignment]

from ddiloco.launch.procs import ProcessTable

REPO_ROOT = Path(__file__).resolve().parents[1]

# One torch thread per process, here and in every process a test starts (they inherit the variable):
# the suite runs two workers side by side on CI's 2 cores, each starting learners and synchronizers
# of tiny models, and PyTorch's default of a thread per core makes them all spin against each other
# (a simulated run of the tiny GPT took 2-4x as long with 2 threads as with 1 beside the suite). A
# test about threads sets its own count; OMP_NUM_THREADS set by hand is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def shakespeare_path() -> Path | None:
    """`../shared/data/tinyshakespeare.txt` next to the repository, or None when it is absent."""
    path = (REPO_ROOT / ".." / "shared" / "data" / "tinyshakespeare.txt").resolve()
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def shakespeare() -> str:
    path = shakespeare_path()
    if path is None:
        pytest.skip(f"tinyshakespeare.txt not found at {REPO_ROOT.parent / 'shared' / 'data'}")
    return str(path)


@pytest.fixture(scope="session")
def tiny_task(shakespeare: str):
    """The tiny GPT on tinyshakespeare: real model and data, fast enough for multi-learner runs."""
    from ddiloco.train.tasks import make_task

    return make_task("gpt", shakespeare, seq_len=16, model_size="tiny")


@pytest.fixture()
def procs():
    table = ProcessTable()
    yield table
    table.stop_all(grace=5.0)
    leftovers = [c.pid for c in table.children if c.alive()]
    assert not leftovers, f"processes left running: {leftovers}"
    for c in table.children:  # reaped: the PID no longer names our child
        with pytest.raises(ChildProcessError):
            os.waitpid(c.pid, os.WNOHANG)


def pytest_configure(config: pytest.Config) -> None:
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Code that runs in the test process may set torch's thread count for the whole process (a
    launcher pins itself to one thread); the next test gets the count back. Results that must match a
    replay to float tolerance are only reproducible at the thread count they were computed with."""
    import torch

    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


# --- side by side (pytest-xdist, `-n 2 --dist loadgroup`) ----------------------------------------------
# Tests that use what the whole machine shares (network namespaces, which tests/hosts lists and
# compares; munge and Slurm daemons, which tests/support/slurm_cluster.py starts and stops) run in one
# worker, one after another; every other test makes its own processes, ports and folders.
MACHINE_WIDE = ("hosts", "cluster", "skypilot")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).resolve().parent
    for item in items:
        parts = item.path.resolve().relative_to(tests).parts
        if parts and parts[0] in MACHINE_WIDE:
            item.add_marker(pytest.mark.xdist_group("machine"))
            # xdist (3.8) names the group by setting `item._nodeid` to "<id>@machine", which pytest
            # 9.2's `nodeid` (built from `item._id`) no longer reads: the group was silently lost
            # and machine-wide tests ran on both workers at once. Set the id pytest reads.
            if coerce_node_id is not None and getattr(config.option, "loadgroup", False):
                item._id = coerce_node_id(f"{item.nodeid}@machine")


# --- a skip is loud in CI ---------------------------------------------------------------------------
# `.ci/run` exports DDILOCO_ALLOWED_SKIPS: one skip a line, "text the skip's reason contains | why CI
# may skip it". With CI=true, any other skip fails the run: a test that skips because a tool is missing
# has not tested anything, and a green CI must not hide it.
_skips: list[tuple[str, str]] = []


def allowed_skips(text: str) -> list[str]:
    """The reason fragments of the allowed-skip lines (everything before each line's "|")."""
    return [line.split("|", 1)[0].strip() for line in text.splitlines() if line.split("|", 1)[0].strip()]


def unallowed(skips: list[tuple[str, str]], allowed: list[str]) -> list[tuple[str, str]]:
    return [(node, reason) for node, reason in skips if not any(a in reason for a in allowed)]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _skips.append((report.nodeid, str(reason)))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A module that skips as a whole (`pytest.importorskip` at its top) is a skip too."""
    if report.skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _skips.append((report.nodeid, str(reason)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI") != "true" or not _skips:
        return
    bad = unallowed(_skips, allowed_skips(os.environ.get("DDILOCO_ALLOWED_SKIPS", "")))
    if bad:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"{len(bad)} test(s) skipped that CI may not skip (.ci/run's DDILOCO_ALLOWED_SKIPS):"]
        lines += [f"  {node}: {reason}" for node, reason in bad]
        if reporter is not None:
            reporter.write_line("\n".join(lines), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
