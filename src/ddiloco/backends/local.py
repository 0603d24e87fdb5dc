"""`ddiloco run --backend local`: the supervised processes on this machine (`launch.supervisor`), the
live view, the dashboard, the final evaluation and the summary; with a network of hosts
(`--network hosts`, `hosts.run`), each process on a host of its own.

`launch` makes the hosts (if asked), the supervisor, the run directory's records and the dashboard;
`follow` runs the processes until the budget or an interrupt, then evaluates and summarizes."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..launch.config import RunConfig
from .base import Launched, LiveView, Output, Refused, Report

if TYPE_CHECKING:
    from ..hosts.run import HostsPlan, HostsRun
    from ..launch.dashboard import Dashboard
    from ..launch.metrics import RunMetrics
    from ..launch.supervisor import Supervisor
    from ..records.rundir import RunDir
    from ..train.tasks import Task


@dataclass(frozen=True)
class LocalOptions:
    """Where and how a local run goes: `hosts` (a `hosts.run.HostsPlan`; None: every process on
    127.0.0.1), the dashboard's (host, port) (None: no dashboard), and `sinks`: (run directory,
    config) -> the metric sinks (TensorBoard, wandb) metrics.jsonl's numbers also go to."""

    hosts: HostsPlan | None = None
    dashboard: tuple[str, int] | None = ("127.0.0.1", 0)
    sinks: Callable[[Path, object], list] | None = None


@dataclass
class _Run:
    """A launched local run: what `follow` drives and closes."""

    config: RunConfig
    task: Task
    sup: Supervisor
    record: RunDir
    metrics: RunMetrics
    board: Dashboard | None
    live: LiveView | None
    network: HostsRun | None
    closing: contextlib.ExitStack


class LocalBackend:
    """The processes on this machine (see the module docstring); `task` is the run's, when the caller
    built it already (it reads the data), else built from the config."""

    name = "local"

    def __init__(self, output: Output, options: LocalOptions | None = None, task: Task | None = None) -> None:
        self.output, self.options, self.task = output, options or LocalOptions(), task

    def launch(self, config: RunConfig) -> Launched:
        if self.task is None:
            from ..train.tasks import make_task

            self.task = make_task(config.model, config.data, seq_len=config.seq_len, model_size=config.model_size)
        task = self.task
        closing = contextlib.ExitStack()
        try:
            network = None
            if self.options.hosts is not None:  # the hosts part loads only for --network hosts
                from ..hosts.run import describe

                network = closing.enter_context(self._hosts(self.options.hosts, config.run_dir))
                lines = "\n  ".join(describe(network.hosts(False)))
                self.output.show(f"hosts (links measured before the run):\n  {lines}")
                config = network.configure(config)
            run = self._prepare(config, task, network, closing)
        except BaseException:
            closing.close()
            raise
        return Launched({"backend": self.name, "run_dir": str(config.run_dir)}, handle=run)

    def _hosts(self, plan: HostsPlan, run_dir: Path) -> HostsRun:
        from ..hosts import HostsUnavailable
        from ..hosts.run import HostsRun

        try:
            return HostsRun(plan, run_dir)
        except HostsUnavailable as exc:
            raise Refused(str(exc), flag="--network hosts") from None

    def _prepare(self, config: RunConfig, task: Task, network: HostsRun | None, closing: contextlib.ExitStack) -> _Run:
        import torch

        from ..launch.dashauth import write_url_file
        from ..launch.metrics import RunMetrics, RunView
        from ..launch.supervisor import Supervisor
        from ..records.rundir import RunDir

        torch.set_num_threads(1)
        live = self.output.live()
        metrics: RunMetrics | None = None

        def on_tick(sup: Supervisor) -> None:
            if live is not None:
                from ..launch.live import render

                live.update(render(sup, metrics.latest["loss"] if metrics is not None else None))

        sup = Supervisor(config, on_tick)
        if network is not None:
            sup.procs.wrap = network.wrap
        record = RunDir(config.run_dir)
        record.write_config("run", config, clock_origin=sup.start_wall)
        sinks = self.options.sinks
        log = record.metrics(sinks(config.run_dir, config) if sinks is not None else ())
        view = RunView(
            sup.start_wall,
            config.learners,
            addresses=lambda: [s.address for s in sup.shards if s.address],
            statuses=lambda: [s.status for s in sup.shards if s.status],
            stopping=lambda: sup.stopping,
            ended=sup.interrupted,
        )
        metrics = RunMetrics(view, task, log, config.eval_every, config.seed, config.token, config.eval_batches)
        board = self._dashboard(config, sup, metrics)
        if board is not None:
            url = board.start()  # with the read-only view credential, never the token
            write_url_file(config.run_dir / "dashboard.url", url)
            self.output.show(f"dashboard: {url}")

        def on_signal(signum: int, frame: Any) -> None:
            sup.interrupted.set()

        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, on_signal)
        return _Run(config, task, sup, record, metrics, board, live, network, closing)

    def _dashboard(self, config: RunConfig, sup: Supervisor, metrics: RunMetrics) -> Dashboard | None:
        if self.options.dashboard is None:
            return None
        from ..launch.dashboard import Dashboard
        from ..launch.livestate import snapshot
        from ..wire import auth

        host, port = self.options.dashboard
        try:
            auth.require_token_policy(host, config.token, False)
            return Dashboard(
                lambda: {**snapshot(sup, metrics.latest["loss"]), "history": list(metrics.history)},
                host,
                port,
                config.token,
            )
        except (ValueError, OSError) as exc:
            raise Refused(str(exc), flag="--dashboard-host/--dashboard-port") from None

    def follow(self, launched: Launched) -> Report:
        run: _Run = launched.handle
        with run.closing:  # the hosts, when there are: removed once the run is summarized
            return self._follow(run)

    def _follow(self, run: _Run) -> Report:
        sup, network = run.sup, run.network
        if network is not None:  # after the dashboard bound its socket here: the rest on the launcher's host
            network.enter()
        run.metrics.start()
        wall_start = time.perf_counter()
        if run.live is not None:
            run.live.start()
        try:
            sup.run()
        finally:
            if network is not None:
                network.leave()
            if run.board is not None:
                run.board.stop()
            if run.live is not None:
                run.live.stop()
        result = _result(sup, run.task, run.config, time.perf_counter() - wall_start)
        if network is not None:
            from ..hosts.run import describe

            result["network"] = network.report()
            lines = "\n  ".join(describe(result["network"]["hosts"]))
            self.output.show(f"links (what each carried):\n  {lines}")
        run.metrics.metrics.write(
            "eval",
            time.time() - sup.start_wall,
            result["tokens"],
            **{k: v for k, v in result.items() if k.startswith("eval_")},
        )
        run.metrics.metrics.close()
        run.record.write_summary(result)
        return Report(result, table=result, error=sup.error)

    def stop(self, run_dir: Path) -> dict:
        raise Refused(
            f"{run_dir}: a local run is stopped by the `ddiloco run` that started it (Ctrl-C, or SIGTERM to "
            "that process), or from anywhere with `ddiloco stop ADDRESS` (its shards' addresses: sync-S/address)"
        )


def _result(sup: Supervisor, task: Task, config: RunConfig, wall_seconds: float) -> dict:
    from ..launch.evaluate import evaluate_checkpoints
    from ..launch.summary import summarize

    stats = summarize(sup.shard_dirs(), sup.learner_dirs(), config.learners, time.time(), sup.start_wall)
    try:
        metrics = evaluate_checkpoints(task, config.seed, sup.shard_dirs(), config.eval_batches)
    except (OSError, ValueError, KeyError) as exc:
        metrics = {"eval_loss": float("nan")}
        sup.error = sup.error or f"could not evaluate the final checkpoint: {exc}"
    window = stats["sim_seconds"]
    offset = stats["window_start"] - sup.start_wall  # chaos times count from the launch
    downtime = sum(
        sup.injector.downtime(m, offset + window) - sup.injector.downtime(m, max(0.0, offset))
        for m in range(config.learners)
    )
    return {
        **config.as_dict(),
        "model": config.model,
        "tokens": stats.pop("tokens"),
        **metrics,
        **stats,
        "availability": 1.0 - downtime / (config.learners * window) if window > 0 else 0.0,
        "wall_seconds": wall_seconds,
        "learner_restarts": sup.learner_restarts,
        "synchronizer_restarts": sum(s.restarts for s in sup.shards),
        "run_dir": str(config.run_dir),
    }
