"""`ddiloco run --backend skypilot`: the same run as on one machine, as SkyPilot tasks.

`launch` writes the task YAMLs (`dry_run` stops there) and launches them (`detach`: nothing to
follow); `follow` watches the run through the synchronizer's Status until it ends. Ctrl+C or SIGTERM
while following ends the run as `ddiloco stop` does (learners send what they hold), then cancels the
learners' jobs and takes the synchronizer's cluster down. `stop` (`ddiloco skypilot-stop RUN_DIR`)
does the same later.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import threading
import time
from pathlib import Path

from ..cluster import skypilot as sky
from ..cluster.skypilot_tasks import SkyOptions, parse_roles, slug, write_tasks
from ..cluster.slurm import shard_addresses
from ..launch.config import RunConfig
from .base import Launched, Output, Report, refusing

FOLLOW_POLL = 2.0
STOP_WAIT = 120.0


def sky_options(
    learners: int, store: str | None, infra: list[str] | None, accelerators: list[str] | None, **rest: object
) -> SkyOptions:
    """The options from the flags' values; $DDILOCO_SKY_PYTHON (the Python on the nodes) and
    $DDILOCO_SKY_SETUP (the task's setup script) replace the defaults, for nodes with a prebuilt
    environment (docs/cluster.md)."""
    node = {"python": os.environ.get("DDILOCO_SKY_PYTHON") or "python3", "setup": os.environ.get("DDILOCO_SKY_SETUP")}
    return SkyOptions(
        store=store,
        infra=parse_roles(infra, "--infra", learners),
        accelerators=parse_roles(accelerators, "--accelerators", learners),
        **node,  # type: ignore[arg-type]
        **rest,  # type: ignore[arg-type]
    )


def prepare(config: RunConfig, opts: SkyOptions) -> tuple[RunConfig, dict[str, Path]]:
    """A token always (the synchronizer listens beyond loopback), in a 0600 file; and the task YAMLs."""
    if config.token is None:
        config = dataclasses.replace(config, token=secrets.token_hex(16))
    config.run_dir.mkdir(parents=True, exist_ok=True)
    token = config.run_dir / "token"
    token.touch(mode=0o600, exist_ok=True)
    token.chmod(0o600)
    token.write_text(config.token or "")
    return config, write_tasks(config, opts)


def _ca(run_dir: Path) -> Path | None:
    ca = run_dir / "skypilot" / "tls-ca" / "ca.pem"
    return ca if ca.is_file() else None


class SkyPilotBackend:
    """SkyPilot tasks (see the module docstring), with `options` (`sky_options` makes them from flags)."""

    name = "skypilot"

    def __init__(
        self, output: Output, options: SkyOptions | None = None, *, dry_run: bool = False, detach: bool = False
    ) -> None:
        self.output, self.options = output, options or SkyOptions()
        self.dry_run, self.detach = dry_run, detach

    def launch(self, config: RunConfig) -> Launched:
        with refusing(ValueError, sky.SkyError):
            return self._launch(config)

    def _launch(self, config: RunConfig) -> Launched:
        opts = self.options
        if opts.store is None and not self.dry_run:
            raise ValueError("--backend skypilot needs --store: a bucket (s3://...), volume:NAME or a shared path")
        config, tasks = prepare(config, opts)
        result: dict = {
            "backend": "skypilot",
            "run_dir": str(config.run_dir),
            "tasks": {r: str(p) for r, p in tasks.items()},
        }
        if self.dry_run:
            self.output.say(f"wrote {len(tasks)} SkyPilot task YAMLs to {config.run_dir / 'skypilot'} (not launched)")
            return Launched(result, followable=False)
        run: dict = {
            "cluster": f"{slug(config)}-sync",
            "host": opts.host,
            "public": opts.public(config.learners),
            "port": opts.port,
            "shards": config.sync_shards,
            "store": opts.store,
            "launched": time.time(),
        }
        run = sky.launch(config.run_dir, tasks, run, config.token or "")
        result["jobs"] = run["jobs"]
        self.output.say(f"launched {run['cluster']} and {len(run['jobs'])} learner jobs")
        if self.detach:
            self.output.say(f"stop the run with: ddiloco skypilot-stop {config.run_dir}")
            return Launched(result, followable=False)
        return Launched(result, handle=(config, run))

    def follow(self, launched: Launched) -> Report:
        config, run = launched.handle
        with refusing(ValueError, sky.SkyError):
            launched.result["summary"] = self._watch(config.run_dir, run, config.token)
        return Report(launched.result)

    def _watch(self, run_dir: Path, run: dict, token: str | None) -> dict:
        """Watch the run until every shard says it is finished; keep their final status as the summary."""
        interrupted = threading.Event()
        previous = {s: signal.signal(s, lambda *_: interrupted.set()) for s in (signal.SIGINT, signal.SIGTERM)}
        ca, last, last_line = _ca(run_dir), None, 0.0
        try:
            while not interrupted.is_set():
                now = _statuses(run, token, ca)
                last = now or last
                if now and all(s.get("finished") for s in now):
                    break
                if time.monotonic() - last_line > 10.0:
                    last_line = time.monotonic()
                    st = (now or [{}])[0]
                    self.output.say(
                        "synchronizer not answering"
                        if not now
                        else f"merges {st.get('merges', 0)}, learners {len(st.get('learners', {}))}, "
                        f"progress {100 * float(st.get('progress', 0.0)):.0f}%"
                    )
                interrupted.wait(FOLLOW_POLL)
            if interrupted.is_set():
                last = self._stop(run_dir, run, token, "the launcher was interrupted") or last
            else:
                sky.cancel(run)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        for shard, final in enumerate(last or []):  # the same summary file as the other backends
            (run_dir / f"sync-{shard}").mkdir(parents=True, exist_ok=True)
            (run_dir / f"sync-{shard}" / "summary.json").write_text(json.dumps(final, indent=1, sort_keys=True))
        return (last or [{}])[0]

    def _stop(
        self, run_dir: Path, run: dict, token: str | None, reason: str = "ddiloco skypilot-stop"
    ) -> list[dict] | None:
        """End the run the clean way (shards checkpoint, learners send their work), then cancel the jobs
        and take the synchronizer's cluster down; returns the shards' last status."""
        ca, last = _ca(run_dir), None
        try:
            for address in addresses(run):
                sky.stop(address, token, ca, reason)
            deadline = time.monotonic() + STOP_WAIT
            while time.monotonic() < deadline:
                last = _statuses(run, token, ca) or last
                if last and all(s.get("finished") or s.get("stopping") and not s.get("learners") for s in last):
                    break
                time.sleep(FOLLOW_POLL)
        except ConnectionError as exc:
            self.output.warn(f"{exc}; cancelling the jobs")
        sky.cancel(run)
        return last

    def stop(self, run_dir: Path) -> dict:
        """`ddiloco skypilot-stop`: the launch, token and CA recorded in the run directory; returns the
        launch record (its cluster and jobs)."""
        with refusing(FileNotFoundError, ValueError, sky.SkyError):
            run = sky.read_run(run_dir)
            token_file = run_dir / "token"
            self._stop(run_dir, run, token_file.read_text().strip() if token_file.is_file() else None)
        return run


def addresses(run: dict) -> list[str]:
    """The shards' addresses: known at launch (--sync-host, a public IP), else those the synchronizer
    task published on the store (sync-S/address), read again each time, when the store is a path here."""
    if run.get("addresses"):
        return list(run["addresses"])
    store = _local_store(run)
    if store is None:
        return []
    return shard_addresses(store, int(run.get("shards", 1))) or []


def _local_store(run: dict) -> Path | None:
    store = run.get("store")
    return Path(store) if store and "://" not in store and not store.startswith("volume:") else None


def _statuses(run: dict, token: str | None, ca: Path | None) -> list[dict] | None:
    try:
        now = [sky.status(a, token, ca) for a in addresses(run)]
        if now:
            return now
    except ConnectionError:
        pass
    store = _local_store(run)  # a shard that finished and exited between two polls left its summary there
    if store is None:
        return None
    finals = []
    for shard in range(int(run.get("shards", 1))):
        path = store / f"sync-{shard}" / "summary.json"
        try:
            if path.stat().st_mtime < float(run.get("launched", 0.0)):
                return None  # an earlier run's
            finals.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None
    return finals if all(isinstance(f, dict) and f.get("finished") for f in finals) else None
