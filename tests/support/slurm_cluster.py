"""A real Slurm cluster on this machine, every daemon on 127.0.0.1, for the tests of `ddiloco slurm`.

    python tests/support/slurm_cluster.py start DIR [--nodes 3]   # prints: export SLURM_CONF=DIR/slurm.conf
    python tests/support/slurm_cluster.py stop DIR                # cancels every job, stops the daemons

One slurmctld and one slurmd per logical node (`slurmd -N nX`, each with its own port), munge for
authentication, all state, spool, pid and log files under DIR. `CommunicationParameters=
NoCtldInAddrAny,NoInAddrAny` keeps every daemon off 0.0.0.0. A requeued job runs again within
seconds (`sched_interval=2`, `cred_expire=5`). Daemons are stopped by the PIDs this script started;
munged only if this script started it. Needs `apt-get install slurmctld slurmd slurm-client munge`
(Slurm 22.05 in Debian 12) and root (slurmd runs jobs as their users).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "munged")


def missing() -> str | None:
    """Why no cluster can start here, or None."""
    absent = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if absent:
        return (
            f"Slurm is not installed ({', '.join(absent)} missing): apt-get install slurmctld slurmd slurm-client munge"
        )
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (slurmd starts jobs as their users)"
    return None


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def write_config(d: Path, nodes: int, cpus: int) -> Path:
    ctld, *slurmd = _free_ports(1 + nodes)
    host = socket.gethostname()
    lines = [
        "ClusterName=ddiloco-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "AuthInfo=cred_expire=5",
        "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1,sched_interval=2",
        "JobRequeue=1",
        "ReturnToService=2",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "SlurmdParameters=config_overrides",  # logical nodes may claim more CPUs than the host has
        "SlurmUser=root",
        "KillWait=10",
        "MinJobAge=300",
        "InactiveLimit=0",
        "SlurmdTimeout=30",
        f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/slurmctld.pid",
        f"SlurmdPidFile={d}/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/slurmctld.log",
        f"SlurmdLogFile={d}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    names = [f"n{i + 1}" for i in range(nodes)]
    for name, port in zip(names, slurmd, strict=True):
        lines.append(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} "
            f"RealMemory=2000 State=UNKNOWN"
        )
    lines.append(f"PartitionName=debug Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP")
    conf = d / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _start_munge(d: Path) -> int | None:
    """munged as the munge user, unless one already answers; returns its PID if we started it."""
    if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
        return None
    run = Path("/run/munge")
    run.mkdir(parents=True, exist_ok=True)
    shutil.chown(run, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", _exe("munged")], check=True)
    for _ in range(100):
        pid_file = run / "munged.pid"
        if pid_file.is_file() and subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
            return int(pid_file.read_text().split()[0])
        time.sleep(0.1)
    raise RuntimeError("munged did not start")


def env(d: Path) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}


def start(d: Path, nodes: int = 3, cpus: int = 2, timeout: float = 60.0) -> dict:
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    d = d.resolve()
    for sub in ("state", "spool"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    write_config(d, nodes, cpus)
    pids: dict = {"munged": _start_munge(d), "slurmd": []}
    e = env(d)
    logs = open(d / "daemons.out", "ab")
    ctld = subprocess.Popen(
        [_exe("slurmctld"), "-D", "-c", "-i"], env=e, stdout=logs, stderr=logs, start_new_session=True
    )
    pids["slurmctld"] = ctld.pid
    for i in range(nodes):
        (d / "spool" / f"n{i + 1}").mkdir(exist_ok=True)
        p = subprocess.Popen(
            [_exe("slurmd"), "-D", "-N", f"n{i + 1}"], env=e, stdout=logs, stderr=logs, start_new_session=True
        )
        pids["slurmd"].append(p.pid)
    (d / "pids.json").write_text(json.dumps(pids))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=e, capture_output=True, text=True)
        states = [line.split()[1] for line in out.stdout.splitlines() if line.strip()]
        if out.returncode == 0 and len(states) == nodes and all(s in ("idle", "mix", "alloc") for s in states):
            return pids
        time.sleep(0.5)
    stop(d)
    raise RuntimeError(f"the test cluster did not come up in {timeout:.0f} s; see {d}/slurmctld.log")


def _kill(pid: int | None, timeout: float = 10.0) -> None:
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            waited, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            waited = 0
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        if waited == pid:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def stop(d: Path, timeout: float = 30.0) -> None:
    """Cancel every job of this private cluster, wait (bounded) for them to go, stop our daemons."""
    d = d.resolve()
    pids_file = d / "pids.json"
    if not pids_file.is_file():
        return
    pids = json.loads(pids_file.read_text())
    e = env(d)
    subprocess.run(["scancel", "--full", "--user", str(os.geteuid())], env=e, capture_output=True, timeout=20)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-o", "%i"], env=e, capture_output=True, text=True, timeout=20)
        if out.returncode != 0 or not out.stdout.strip():
            break
        time.sleep(0.5)
    for pid in pids.get("slurmd", []):
        _kill(pid)
    _kill(pids.get("slurmctld"))
    _kill(pids.get("munged"))
    pids_file.unlink()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop", "check"])
    parser.add_argument("dir", type=Path, nargs="?", default=Path("/tmp/ddiloco-slurm"))
    parser.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args()
    if args.action == "check":
        reason = missing()
        print(reason or "Slurm can run here")
        return 1 if reason else 0
    if args.action == "start":
        start(args.dir, args.nodes)
        print(f"export SLURM_CONF={args.dir.resolve() / 'slurm.conf'}")
    else:
        stop(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
