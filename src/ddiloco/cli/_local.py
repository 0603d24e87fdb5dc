"""`ddiloco run --backend local`: the supervised processes on this machine, the live view, the dashboard,
the final evaluation and the summary (the Slurm backend is `_slurm`)."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import typer

from ..launch.config import RunConfig


def run_locally(config: RunConfig, task, *, hosts=None, **kwargs) -> None:  # noqa: ANN001
    """The run on loopback, or (`hosts`, a ddiloco.hosts.run.HostsPlan) each process on a host of its own."""
    if hosts is None:
        return _run_locally(config, task, **kwargs)
    from ..hosts import HostsUnavailable
    from ..hosts.run import HostsRun, describe
    from .output import stderr

    try:
        network = HostsRun(hosts, config.run_dir)
    except HostsUnavailable as exc:
        raise typer.BadParameter(str(exc), param_hint="--network hosts") from None
    with network:
        lines = "\n  ".join(describe(network.hosts(False)))
        stderr.print(f"hosts (links measured before the run):\n  {lines}", soft_wrap=True)
        return _run_locally(network.configure(config), task, network=network, **kwargs)


def _run_locally(
    config: RunConfig,
    task,
    *,
    network=None,  # noqa: ANN001 (a ddiloco.hosts.run.HostsRun: where the processes run)
    method: str,
    quiet: bool,
    eval_every: float,  # noqa: ANN001
    as_json: bool,
    make_sinks: Callable[[Path, object], list],
    dashboard: tuple[str, int] | None,
) -> None:
    """Run the configured processes until the budget or an interrupt, then evaluate and summarize."""
    import torch
    from rich.live import Live

    from ..launch.dashauth import write_url_file
    from ..launch.dashboard import Dashboard
    from ..launch.livestate import snapshot
    from ..launch.metrics import RunMetrics, RunView
    from ..launch.supervisor import Supervisor
    from ..records.rundir import RunDir
    from ..wire import auth
    from .output import print_summary, stderr

    torch.set_num_threads(1)
    live = None if quiet else Live(console=stderr, refresh_per_second=2, transient=False)
    metrics = None

    def on_tick(sup: Supervisor) -> None:
        if live is not None:
            from ..launch.live import render

            live.update(render(sup, metrics.latest["loss"] if metrics is not None else None))

    sup = Supervisor(config, on_tick)
    if network is not None:
        sup.procs.wrap = network.wrap
    record = RunDir(config.run_dir)
    record.write_config("run", config, clock_origin=sup.start_wall)
    log = record.metrics(make_sinks(config.run_dir, config))
    view = RunView(
        sup.start_wall,
        config.learners,
        addresses=lambda: [s.address for s in sup.shards if s.address],
        statuses=lambda: [s.status for s in sup.shards if s.status],
        stopping=lambda: sup.stopping,
        ended=sup.interrupted,
    )
    metrics = RunMetrics(view, task, log, eval_every, config.seed, config.token)
    board = None
    if dashboard is not None:
        dashboard_host, dashboard_port = dashboard
        try:
            auth.require_token_policy(dashboard_host, config.token, False)
            board = Dashboard(
                lambda: {**snapshot(sup, metrics.latest["loss"]), "history": list(metrics.history)},
                dashboard_host,
                dashboard_port,
                config.token,
            )
        except (ValueError, OSError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--dashboard-host/--dashboard-port") from None
        url = board.start()  # with the read-only view credential, never the token
        write_url_file(config.run_dir / "dashboard.url", url)
        stderr.print(f"dashboard: {url}", soft_wrap=True)

    def on_signal(signum, frame):  # noqa: ANN001
        sup.interrupted.set()

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, on_signal)
    if network is not None:  # after the dashboard bound its socket here: the rest on the launcher's host
        network.enter()
    metrics.start()
    wall_start = time.perf_counter()
    if live is not None:
        live.start()
    try:
        sup.run()
    finally:
        if network is not None:
            network.leave()
        if board is not None:
            board.stop()
        if live is not None:
            live.stop()
            stderr.print()
    result = _result(sup, task, config, time.perf_counter() - wall_start)
    if network is not None:
        from ..hosts.run import describe

        result["network"] = network.report()
        lines = "\n  ".join(describe(result["network"]["hosts"]))
        stderr.print(f"links (what each carried):\n  {lines}", soft_wrap=True)
    metrics.metrics.write(
        "eval",
        time.time() - sup.start_wall,
        result["tokens"],
        **{k: v for k, v in result.items() if k.startswith("eval_")},
    )
    metrics.metrics.close()
    record.write_summary(result)
    print_summary(result, title=f"ddiloco run --method {method}")
    if sup.error:
        stderr.print(f"[red]error:[/red] {sup.error}")
    if as_json:
        print(json.dumps(result, sort_keys=True), flush=True)
    if sup.error:
        sys.exit(1)


def _result(sup, task, config, wall_seconds: float) -> dict:  # noqa: ANN001
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
