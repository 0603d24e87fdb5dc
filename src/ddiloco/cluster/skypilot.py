"""Launching, watching and ending a run's SkyPilot tasks, through SkyPilot's own `sky` command.

`sky` is called as a program (not imported) so that SkyPilot stays an optional extra and its
versions, API server and credentials are the user's. The token reaches `sky` in its environment
only (`--secret DDILOCO_TOKEN` takes the value from there), never on a command line. What was
launched goes to RUN_DIR/skypilot/run.json at once, so `ddiloco skypilot-stop` can end a run
whose launcher is gone. Every call is bounded in time; a failing `sky` raises `SkyError`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import grpc

from ..records.atomic import atomic_write
from ..wire import auth, framing, rpc

LAUNCH_TIMEOUT = 3600.0  # provisioning can take long (spot capacity, a Kubernetes pod pulling an image)
COMMAND_TIMEOUT = 300.0


class SkyError(RuntimeError):
    pass


def _sky(args: list[str], token: str | None = None, timeout: float = COMMAND_TIMEOUT) -> str:
    if shutil.which("sky") is None:
        raise SkyError("sky not found: pip install 'ddiloco[skypilot]' and `sky check` (or use --dry-run)")
    env = {**os.environ, **({"DDILOCO_TOKEN": token} if token is not None else {})}
    try:
        done = subprocess.run(["sky", *args], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise SkyError(f"sky {' '.join(args[:2])} did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        raise SkyError(f"sky {' '.join(args[:2])} failed: {(done.stderr.strip() or done.stdout.strip())[-2000:]}")
    return done.stdout


def run_file(run_dir: Path) -> Path:
    return run_dir / "skypilot" / "run.json"


def read_run(run_dir: Path) -> dict:
    path = run_file(run_dir)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no SkyPilot launch recorded for this run directory")
    run = json.loads(path.read_text())
    if not isinstance(run, dict) or not isinstance(run.get("cluster"), str) or not isinstance(run.get("jobs"), dict):
        raise ValueError(f"{path} is not a run file written by ddiloco")
    return run


def _record(run_dir: Path, run: dict) -> None:
    run_file(run_dir).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(run_file(run_dir), json.dumps(run, indent=1, sort_keys=True).encode())


def _job_id(output: str) -> str:
    found = re.findall(r"(?:Job|job) ID:\s*(\d+)", output) or re.findall(r"ID:\s*(\d+)", output)
    if not found:
        raise SkyError(f"sky jobs launch printed no job ID: {output.strip()[-500:]}")
    return found[-1]


def launch(run_dir: Path, tasks: dict[str, Path], run: dict, token: str) -> dict:
    """The synchronizer task on its cluster (its address found, when public, before it starts), then
    each learner as a managed job. A failure ends what was launched, so no half-run is left."""
    cluster, secret = run["cluster"], ["--secret", "DDILOCO_TOKEN"]
    run = {**run, "jobs": {}}
    _record(run_dir, run)
    try:
        host = run["host"]
        if host == "auto" and run["public"]:  # provision first, then start it with the address it publishes
            _sky(["launch", "-y", "-c", cluster, "--detach-run", *secret, str(tasks["sync"])], token, LAUNCH_TIMEOUT)
            host = _sky(["status", "--ip", cluster]).strip().splitlines()[-1].strip()
            rpc.check_address(f"{host}:1")
            _sky(
                ["exec", cluster, "--detach-run", *secret, "--env", f"DDILOCO_ADVERTISE={host}", str(tasks["sync"])],
                token,
            )
        else:
            env = ["--env", f"DDILOCO_ADVERTISE={host}"] if host != "auto" else []
            _sky(
                ["launch", "-y", "-c", cluster, "--detach-run", *secret, *env, str(tasks["sync"])],
                token,
                LAUNCH_TIMEOUT,
            )
        if host != "auto":
            run["addresses"] = [f"{host}:{run['port'] + s}" for s in range(run["shards"])]
        _record(run_dir, run)
        for role in sorted(r for r in tasks if r != "sync"):
            name = f"{cluster.removesuffix('-sync')}-{role}"
            out = _sky(
                ["jobs", "launch", "-y", "--detach-run", "-n", name, *secret, str(tasks[role])], token, LAUNCH_TIMEOUT
            )
            run["jobs"][role] = _job_id(out)
            _record(run_dir, run)
    except (SkyError, ValueError):
        cancel(run)
        raise
    return run


def cancel(run: dict) -> None:
    """Cancel the learners' managed jobs and take the synchronizer's cluster down (its checkpoints
    stay on the store). Both are tried even when one fails."""
    errors = []
    if run.get("jobs"):
        try:
            _sky(["jobs", "cancel", "-y", *run["jobs"].values()])
        except SkyError as exc:
            errors.append(str(exc))
    try:
        _sky(["down", "-y", run["cluster"]], timeout=LAUNCH_TIMEOUT)
    except SkyError as exc:
        errors.append(str(exc))
    if errors:
        raise SkyError("; ".join(errors))


def _call(address: str, method: str, token: str | None, ca: Path | None, body: dict, timeout: float) -> dict:
    """One control call to a shard, over TLS when the run has its CA (`ddiloco stop` has no TLS flag)."""
    rpc.check_address(address)
    credentials = auth.channel_credentials(ca) if ca is not None else None
    channel = rpc.open_channel(address, "control", framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN, credentials)
    try:
        return framing.read_message(rpc.Stubs(channel, token).call(method, framing.message(body), timeout))
    except grpc.RpcError as exc:
        raise ConnectionError(f"synchronizer {address} did not answer {method} ({exc.code().name})") from None
    finally:
        channel.close()


def status(address: str, token: str | None, ca: Path | None, timeout: float = 5.0) -> dict:
    return _call(address, "Status", token, ca, {}, timeout)


def stop(address: str, token: str | None, ca: Path | None, reason: str, timeout: float = 10.0) -> dict:
    return _call(address, "Stop", token, ca, {"reason": reason[:200]}, timeout)
