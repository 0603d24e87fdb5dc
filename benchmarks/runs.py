"""Running `ddiloco run` from a benchmark: its JSON result, and its processes stopped on Ctrl+C."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


def machine_load() -> dict:
    """The machine's 1-minute load average and its CPUs: a benchmark run records it before and after
    (`ddiloco_run`), so a run made beside other work shows it (a run's own processes add their count)."""
    return {"load_1min": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}


def ddiloco_run(args: list[str], run_dir: Path, what: str, command: str = "run") -> dict:
    """`ddiloco run ARGS --run-dir RUN_DIR --json --quiet` (or `ddiloco sim ...`); its summary (its last
    line), with the machine's load before and after it (`load`)."""
    cmd = [sys.executable, "-m", "ddiloco", command, *args, "--run-dir", str(run_dir), "--json", "--quiet"]
    before = machine_load()
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
    result["load"] = {"before": before, "after": machine_load()}
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
