"""Running `ddiloco run` from a benchmark: its JSON result, and its processes stopped on Ctrl+C."""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


def machine_load() -> dict:
    """The machine's 1-minute load average and its CPUs: a benchmark run records it before and after
    (`ddiloco_run`), so a run made beside other work shows it (a run's own processes add their count)."""
    return {"load_1min": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}


# A run is "beside other work" when processes that are not its own used more than this share of the
# machine's CPU time over its wall time (a quiet machine's daemons use well under 1 %).
QUIET_SHARE = 0.10


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: every state but idle and
    iowait, over all CPUs)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    guest = sum(fields[8:10])  # already counted in user and nice
    return (sum(fields) - idle - guest) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of every descendant it (and they, in turn) waited for."""
    usages = (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    return sum(u.ru_utime + u.ru_stime for u in usages)


def others_share(busy_seconds: float, own_seconds: float, wall_seconds: float, cpus: int) -> float:
    """The share of the machine's CPU time (cpus x wall) that processes other than the run's used."""
    if wall_seconds <= 0 or cpus <= 0:
        return 0.0
    return min(1.0, max(0.0, (busy_seconds - own_seconds) / (cpus * wall_seconds)))


class CpuWitness:
    """Whether a run had the machine to itself: the machine's busy CPU seconds over the run (all of
    /proc/stat) minus the run's own (this process and its waited-for descendants), over the CPU time
    there was. A load average cannot say it: a run's own processes raise it, and it lags a minute.
    Processes the run does not wait for itself (a Slurm job, run by slurmd) count as others'."""

    def __init__(self) -> None:
        self.busy, self.own, self.wall = busy_cpu_seconds(), own_cpu_seconds(), time.monotonic()

    def share(self) -> float:
        wall = time.monotonic() - self.wall
        return others_share(busy_cpu_seconds() - self.busy, own_cpu_seconds() - self.own, wall, os.cpu_count() or 1)


def ddiloco_run(args: list[str], run_dir: Path, what: str, command: str = "run") -> dict:
    """`ddiloco run ARGS --run-dir RUN_DIR --json --quiet` (or `ddiloco sim ...`); its summary (its last
    line), with the machine's load before and after it and the share of the CPU other processes used
    meanwhile (`load`: `others_cpu_share`, `quiet` when at most QUIET_SHARE)."""
    cmd = [sys.executable, "-m", "ddiloco", command, *args, "--run-dir", str(run_dir), "--json", "--quiet"]
    before = machine_load()
    witness = CpuWitness()
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = launcher.communicate()
    except BaseException:  # Ctrl+C / SIGTERM: let the launcher stop its processes by PID, then go
        launcher.send_signal(signal.SIGINT)
        launcher.communicate(timeout=120)
        raise
    if launcher.returncode != 0:
        raise SystemExit(f"ddiloco {command} ({what}) failed:\n{stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    share = witness.share()
    result["load"] = {
        "before": before,
        "after": machine_load(),
        "others_cpu_share": round(share, 3),
        "quiet": share <= QUIET_SHARE,
    }
    return result


def parse_run_arguments(p: argparse.ArgumentParser, tokens: int) -> argparse.Namespace:
    """The flags every `ddiloco run` benchmark shares, parsed; SIGTERM ends the runs' processes too."""
    p.add_argument("--model-size", default="default", choices=("tiny", "default"))
    p.add_argument("--tokens", type=int, default=tokens)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    return args
