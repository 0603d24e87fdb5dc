"""A Slurm cluster spread over hosts: slurmctld on host `ctl`, one slurmd per host `n1`, `n2`, ...
(each its own `NodeAddr`, the host's 198.18 address), and a munged of its own (its own socket, named in
`AuthInfo`, so no munged of the machine is used or stopped). Every daemon is started with `net.popen`,
so the network stops it; Slurm's commands run inside host `ctl` (the root namespace has no route).

What it takes, found by trying (see docs/hosts.md):
- `ip netns exec` remounts /sys in a mount namespace of its own, with no cgroup file systems there, and
  slurmd then refuses to start ("No filesystem mounted on /sys/fs/cgroup"): slurmd runs under
  `nsenter --mount=/proc/<this process>/ns/mnt` (this process's mount namespace, its own network);
  init's (`/proc/1/ns/mnt`) is refused here;
- `CommunicationParameters=NoCtldInAddrAny,NoInAddrAny` (tests/support/slurm_cluster.py, on loopback)
  makes the daemons bind the address the machine's host name resolves to, which no host has: left out,
  since in a host "any address" is that host's own only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ..support import slurm_cluster as sc
from .conftest import close_and_check, new_network


class SlurmHosts:
    def __init__(self, net, d: Path, nodes: list[str], ctl: str = "ctl", cpus: int = 2) -> None:
        self.net, self.d, self.nodes, self.ctl = net, d, nodes, ctl
        d.mkdir(parents=True)
        # munged's socket and files: a folder of its own that the munge user can reach (pytest's are
        # root's, mode 700), owned by it (munged checks)
        self.munge_dir = Path(tempfile.mkdtemp(prefix="ddl-munge-"))
        shutil.chown(self.munge_dir, "munge", "munge")
        self.munge_dir.chmod(0o755)  # munged wants its socket's folder reachable by everyone
        m = self.munge_dir
        for sub in ("state", *(f"spool/{n}" for n in nodes)):
            (d / sub).mkdir(parents=True)
        self.conf = d / "slurm.conf"
        self.conf.write_text("\n".join(self._config(cpus)) + "\n")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.logs = open(d / "daemons.out", "ab")  # noqa: SIM115 - closed in close()
        munge = [sc._exe("munged"), "-F", "--socket", str(m / "munge.sock"), "--pid-file", str(m / "munged.pid")]
        munge += ["--log-file", str(m / "munged.log"), "--seed-file", str(m / "munged.seed")]
        net.popen(ctl, ["runuser", "-u", "munge", "--", *munge], stdout=self.logs, stderr=self.logs)
        self._wait(lambda: (m / "munge.sock").exists(), 30, "munged's socket")
        net.popen(ctl, [sc._exe("slurmctld"), "-D", "-c", "-i"], env=self.env, stdout=self.logs, stderr=self.logs)
        own_mounts = f"--mount=/proc/{os.getpid()}/ns/mnt"
        for n in nodes:
            argv = ["nsenter", own_mounts, sc._exe("slurmd"), "-D", "-N", n]
            net.popen(n, argv, env=self.env, stdout=self.logs, stderr=self.logs)

    def _config(self, cpus: int) -> list[str]:
        host = socket.gethostname()  # NodeHostname only: every address below is given, none is looked up
        lines = []
        for line in sc.write_config(self.d, len(self.nodes), cpus).read_text().splitlines():
            key = line.split("=", 1)[0]
            if key == "CommunicationParameters" or key == "NodeName" or key == "PartitionName":
                continue
            if key == "SlurmctldHost":
                line = f"SlurmctldHost={host}({self.net.address(self.ctl)})"
            elif key == "SlurmctldPort":
                line = "SlurmctldPort=6817"  # each host has ports of its own
            elif key == "AuthInfo":
                line = f"AuthInfo=cred_expire=5,socket={self.munge_dir}/munge.sock"
            lines.append(line)
        for n in self.nodes:
            lines.append(
                f"NodeName={n} NodeHostname={host} NodeAddr={self.net.address(n)} Port=6818 CPUs={cpus} "
                "RealMemory=2000 State=UNKNOWN"
            )
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        return lines

    @staticmethod
    def _wait(condition, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = condition()
            if got:
                return got
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    def run(self, *argv: str, timeout: float = 20, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """A command inside host ctl (sinfo, sbatch, `ddiloco run --backend slurm`, ...), with SLURM_CONF
        and `env` added to this process's environment."""
        return subprocess.run(
            self.net.command(self.ctl, list(argv)),
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def scontrol(self, *argv: str) -> str:
        done = self.run("scontrol", *argv)
        assert done.returncode == 0, (argv, done.stderr)
        return done.stdout

    def nodes_of(self, job: str) -> list[str]:
        """The nodes a running job holds (empty while it is not running)."""
        out = self.run("squeue", "-h", "-t", "RUNNING", "-j", job, "-o", "%N")
        if out.returncode != 0 or not out.stdout.strip():
            return []
        return self.scontrol("show", "hostnames", out.stdout.strip()).split()

    def set_state(self, node: str, state: str) -> None:
        """`drain` (no new job there; what runs goes on) or `resume`."""
        self.scontrol("update", f"nodename={node}", f"state={state}", *(["reason=test"] if state == "drain" else []))

    def wait_idle(self, timeout: float = 90) -> None:
        def idle() -> bool:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t")
            states = [line.split()[1] for line in out.stdout.splitlines() if line.strip()]
            return out.returncode == 0 and len(states) == len(self.nodes) and all(s == "idle" for s in states)

        self._wait(idle, timeout, f"every slurmd idle (see {self.d}/slurmctld.log)")

    def wait_queue_empty(self, timeout: float = 60) -> None:
        def empty() -> bool:
            out = self.run("squeue", "-h", "-o", "%i")
            return out.returncode == 0 and not out.stdout.strip()

        self._wait(empty, timeout, "the queue to empty")

    def close(self) -> None:
        """Cancel every job (bounded wait); the network then stops the daemons (call its close after)."""
        try:
            self.run("scancel", "--full", "--user", str(os.geteuid()))
            self.wait_queue_empty(30)
        finally:
            self.logs.close()

    def remove_munge_dir(self) -> None:
        """Once munged is stopped (the network closed)."""
        shutil.rmtree(self.munge_dir, ignore_errors=True)


@contextlib.contextmanager
def slurm_hosts(d: Path, nodes: list[str]) -> Iterator[SlurmHosts]:
    """Hosts `ctl` and `nodes`, and a Slurm cluster on them, every slurmd idle; on exit the jobs are
    cancelled, the network (and with it every daemon) ends, and munged's folder is removed."""
    net = new_network(["ctl", *nodes])
    cluster = None
    try:
        cluster = SlurmHosts(net, d, nodes)
        cluster.wait_idle()
        yield cluster
    finally:
        try:
            if cluster is not None:
                cluster.close()
        finally:
            close_and_check(net)
            if cluster is not None:
                cluster.remove_munge_dir()
