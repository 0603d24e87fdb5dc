"""Issue 28's Slurm across hosts, its first part: a Slurm cluster with one slurmd per host (distinct
`NodeAddr`s, 198.18 addresses), slurmctld on a host of its own, and a 2-node job whose `srun` runs one
task on each host, each seeing its own host's address. (Not yet: a 2-node learner with torchrun and
gloo between the hosts, and a learner job requeued onto another host; see docs/hosts.md.)"""

from __future__ import annotations

import pytest

from ..support import slurm_cluster as sc
from .conftest import close_and_check, new_network
from .slurm_hosts import SlurmHosts


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_one_slurmd_per_host_runs_a_two_node_job(tmp_path):
    reason = sc.missing()
    if reason:
        pytest.skip(reason)
    net = new_network(["ctl", "n1", "n2"])
    cluster = None
    try:
        cluster = SlurmHosts(net, tmp_path / "slurm", ["n1", "n2"])
        cluster.wait_idle()
        out = tmp_path / "job.out"
        task = tmp_path / "task.sh"  # a file: expanded where each task runs, not by the batch script's shell
        task.write_text("echo \"$SLURMD_NODENAME $(ip -4 -o addr show eth0 | awk '{print $4}')\"\n")
        done = cluster.run("sbatch", "-N2", "-o", str(out), "--wait", "--wrap", f"srun -N2 bash {task}", timeout=120)
        assert done.returncode == 0, (done.stdout, done.stderr)
        lines = [line.split() for line in out.read_text().splitlines() if line.strip()]
        assert len(lines) == 2, lines
        seen = dict(lines)
        # one task on each host, at that host's own address (each slurmd its own NodeAddr)
        assert seen == {"n1": f"{net.address('n1')}/15", "n2": f"{net.address('n2')}/15"}, seen
    finally:
        try:
            if cluster is not None:
                cluster.close()
        finally:
            close_and_check(net)
            if cluster is not None:
                cluster.remove_munge_dir()
