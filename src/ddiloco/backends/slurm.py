"""`ddiloco run --backend slurm`: the same run as on one machine, as Slurm jobs.

`launch` writes the job scripts (`dry_run` stops there) and submits them (`detach`: nothing to follow);
`follow` watches the run until the synchronizer's jobs end. Ctrl+C or SIGTERM while following ends the
run as `ddiloco stop` does (learners send what they hold), then cancels whatever is still queued.
`stop` (`ddiloco slurm-stop RUN_DIR`) does the same for a detached run. A followed run records what a
local run does (config.json, metrics.jsonl over time, summary.json and the same --json keys:
`slurm_record`).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..api.control import shard_status, stop_run
from ..cluster import slurm
from ..cluster.sbatch import SlurmOptions, write_scripts
from ..launch.config import RunConfig
from .base import Launched, Output, Refused, Report, refusing

FOLLOW_POLL = 2.0
STOP_WAIT = 60.0


def prepare(config: RunConfig, opts: SlurmOptions) -> tuple[RunConfig, dict[str, Path]]:
    """A token for a run that listens beyond loopback, and the scripts."""
    if config.token is None and opts.host not in ("127.0.0.1", "localhost", "::1"):
        config = dataclasses.replace(config, token=secrets.token_hex(16))
    return config, write_scripts(config, opts)


class SlurmBackend:
    """Slurm jobs (see the module docstring): `options` for every job; `sinks`: (run directory,
    config) -> the metric sinks of a followed run (a detached one records no metrics)."""

    name = "slurm"

    def __init__(
        self,
        output: Output,
        options: SlurmOptions | None = None,
        *,
        dry_run: bool = False,
        detach: bool = False,
        sinks: Callable[[Path, object], list] | None = None,
    ) -> None:
        self.output, self.options = output, options or SlurmOptions()
        self.dry_run, self.detach, self.sinks = dry_run, detach, sinks

    def launch(self, config: RunConfig) -> Launched:
        with refusing(ValueError, slurm.SlurmError):
            return self._launch(config)

    def _launch(self, config: RunConfig) -> Launched:
        config, scripts = prepare(config, self.options)
        result: dict = {
            "backend": "slurm",
            "run_dir": str(config.run_dir),
            "scripts": {r: str(p) for r, p in scripts.items()},
        }
        if self.dry_run:
            self.output.say(f"wrote {len(scripts)} job scripts to {config.run_dir / 'slurm'} (not submitted)")
            return Launched(result, followable=False)
        (config.run_dir / "slurm" / "run.json").write_text(json.dumps({"sync_shards": config.sync_shards}))
        from .slurm_record import SlurmRecord

        started, wall_start = time.time(), time.perf_counter()
        record = SlurmRecord(config, started)  # config.json: its clock origin is the submission
        jobs = slurm.submit(config.run_dir, scripts)
        result["jobs"] = jobs
        self.output.say(f"submitted {len(jobs)} jobs: " + ", ".join(f"{r} {j}" for r, j in jobs.items()))
        if self.detach:
            self.output.say(f"stop the run with: ddiloco slurm-stop {config.run_dir}")
            return Launched(result, followable=False)
        return Launched(result, handle=(config, jobs, record, wall_start))

    def follow(self, launched: Launched) -> Report:
        config, jobs, record, wall_start = launched.handle
        result = launched.result
        with refusing(ValueError, slurm.SlurmError):
            record.start(self.sinks(config.run_dir, config) if self.sinks is not None else ())
            result["summary"] = self._watch(config, jobs)
            keys, error = record.finish(time.perf_counter() - wall_start)
        result.update(keys)
        if error:
            result["error"] = error
        table = {k: v for k, v in result.items() if k not in ("scripts", "jobs", "summary")}
        return Report(result, table=table if "goodput" in result else None, error=result.get("error"))

    def _watch(self, config: RunConfig, jobs: dict[str, str]) -> dict:
        """Watch the run until every synchronizer job has ended; returns shard 0's final status."""
        interrupted = threading.Event()
        previous = {s: signal.signal(s, lambda *_: interrupted.set()) for s in (signal.SIGINT, signal.SIGTERM)}
        sync_roles = [r for r in jobs if r.startswith("sync")]
        last_line = 0.0
        try:
            while not interrupted.is_set():
                states = slurm.states(jobs)
                if all(states[r] in slurm.FINISHED or states[r] == "GONE" for r in sync_roles):
                    break
                if time.monotonic() - last_line > 10.0:
                    last_line = time.monotonic()
                    self.output.say(_progress_line(config, states))
                interrupted.wait(FOLLOW_POLL)
            if interrupted.is_set():
                self._stop(config.run_dir, config.sync_shards, config.token, jobs, "the launcher was interrupted")
            else:  # the synchronizer ended the run: learners leave by themselves; cancel any still queued
                _cancel_leftovers(jobs)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        summary = config.sync_dir(0) / "summary.json"
        return json.loads(summary.read_text()) if summary.is_file() else {}

    def _stop(
        self, run_dir: Path, shards: int, token: str | None, jobs: dict[str, str], reason: str = "ddiloco slurm-stop"
    ) -> None:
        """End the run the clean way (shards checkpoint, learners send their work), then cancel the jobs."""
        live = slurm.shard_addresses(run_dir, shards)
        if live:
            try:
                stop_run(live, token, reason)
            except ConnectionError as exc:
                self.output.warn(f"{exc}; cancelling the jobs")
        deadline = time.monotonic() + STOP_WAIT
        while time.monotonic() < deadline:
            if all(s in slurm.FINISHED or s == "GONE" for s in slurm.states(jobs).values()):
                return
            time.sleep(FOLLOW_POLL)
        slurm.cancel(jobs)

    def stop(self, run_dir: Path) -> dict[str, str]:
        """`ddiloco slurm-stop`: the jobs, shards and token recorded in the run directory; returns the jobs."""
        with refusing(FileNotFoundError, ValueError, slurm.SlurmError):
            jobs = slurm.read_jobs(run_dir)
            described = run_dir / "slurm" / "run.json"
            if not described.is_file() and (run_dir / "dataparallel.jsonl").is_file():
                raise Refused(
                    f"{run_dir} holds a data-parallel run (--method ddp|elastic-ddp): the `ddiloco run` that started "
                    "it follows it, and cancels its jobs when it ends. Stop it there (Ctrl-C, or SIGTERM to that "
                    f"process); if that process is gone, cancel its jobs: scancel {' '.join(sorted(jobs.values()))}"
                )
            if not described.is_file():
                raise FileNotFoundError(f"{described}: not a run started by ddiloco run --backend slurm")
            token_file = run_dir / "token"
            token = token_file.read_text().strip() if token_file.is_file() else None
            shards = int(json.loads(described.read_text()).get("sync_shards", 1))
            self._stop(run_dir, shards, token, jobs)
        return jobs


def _progress_line(config: RunConfig, states: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    line = "jobs " + ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
    shards = slurm.shard_addresses(config.run_dir, config.sync_shards)
    if shards:
        try:
            st = shard_status(shards[0], config.token)
            line += (
                f"; merges {st.get('merges', 0)}, learners {len(st.get('learners', {}))}, "
                f"progress {100 * float(st.get('progress', 0.0)):.0f}%"
            )
        except ConnectionError:
            line += "; synchronizer not answering"
    return line


def _cancel_leftovers(jobs: dict[str, str], wait: float = STOP_WAIT) -> None:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        states = slurm.states(jobs)
        live = {r: j for r, j in jobs.items() if states[r] not in slurm.FINISHED and states[r] != "GONE"}
        if not live:
            return
        if all(states[r] == "PENDING" for r in live):  # requeued learners waiting for a node: not needed now
            break
        time.sleep(FOLLOW_POLL)
    states = slurm.states(jobs)  # once: one squeue for every job
    slurm.cancel({r: j for r, j in jobs.items() if states[r] not in slurm.FINISHED and states[r] != "GONE"})
