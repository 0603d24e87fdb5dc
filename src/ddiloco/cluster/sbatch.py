"""The sbatch scripts of a run: one job per synchronizer shard, one requeueable job per learner.

Separate jobs rather than one heterogeneous job, because Slurm requeues, cancels and reschedules a
job as a whole: a preempted learner must come back on its own, on any node, while the synchronizer
and the other learners go on. The scripts run exactly the commands `ddiloco run` starts on one
machine (`RunConfig.synchronizer_args` / `learner_args`), so both backends train the same run.

Learners find the synchronizer through the address files its shards write on the shared run
directory (`--connect @FILE`), read again whenever a shard stops answering, so a shard whose job is
requeued onto another node is found again without restarting any learner. The auth token is in `RUN_DIR/token` (mode
0600) and reaches the processes through $DDILOCO_TOKEN, never on a command line.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..launch.config import RunConfig

SCRATCH = "__DDILOCO_SCRATCH__"  # replaced by a node-local folder new at every job start
LEARNER_STATES = ("shared", "scratch")


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None  # sbatch --time, e.g. 1-00:00:00
    nodes_per_learner: int = 1
    procs_per_node: int = 1  # ranks per node of each learner (torchrun --nproc-per-node)
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    host: str = "auto"  # the synchronizer's listen address: auto = the node's first address
    python: str = sys.executable
    term_grace: float = 20.0  # a learner told to stop (SIGTERM) sends its work and exits within this
    address_wait: int = 600  # seconds a learner job waits for the synchronizer's address files
    max_restarts: int = 2  # restarts inside one job of a crashed shard or torchrun group, before the job fails
    extra: tuple[str, ...] = field(default_factory=tuple)  # more #SBATCH lines, e.g. "--qos=preempt"
    learner_state: str = "shared"  # or scratch: the inner state on node-local disk, new at every start

    def __post_init__(self) -> None:
        if self.nodes_per_learner < 1 or self.procs_per_node < 1 or self.gpus_per_node < 0:
            raise ValueError("--nodes-per-learner and --procs-per-node must be >= 1, --gpus-per-node >= 0")
        if self.learner_state not in LEARNER_STATES:
            raise ValueError(f"learner state must be one of {LEARNER_STATES}, got {self.learner_state!r}")
        if self.max_restarts < 0:
            raise ValueError("--max-restarts must be >= 0")
        if self.term_grace <= 0 or self.address_wait < 1:
            raise ValueError("--term-grace must be > 0 and the address wait >= 1 s")
        for arg in self.extra:
            if not arg.startswith("--") or "\n" in arg:
                raise ValueError(f"--sbatch-arg {arg!r}: give one sbatch option such as --qos=preempt")


def _header(name: str, out: Path, opts: SlurmOptions, nodes: int, requeue: bool, gpus: int) -> list[str]:
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --output={out}/slurm-%j.out",
        "#SBATCH --open-mode=append",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --requeue" if requeue else "#SBATCH --no-requeue",
    ]
    if opts.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={opts.cpus_per_task}")
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={gpus}")
    for flag, value in (("partition", opts.partition), ("account", opts.account), ("time", opts.time_limit)):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    lines += [f"#SBATCH {arg}" for arg in opts.extra]
    return lines + ["set -uo pipefail", f"cd {shlex.quote(str(Path.cwd()))}"]


def _token_lines(config: RunConfig) -> list[str]:
    if config.token is None:
        return []
    token = shlex.quote(str(config.run_dir.resolve() / "token"))
    return [f'DDILOCO_TOKEN="$(cat {token})"', "export DDILOCO_TOKEN"]


def _command(args: list[str]) -> str:
    special = {SCRATCH: '"$SCRATCH"'}
    return " ".join(special.get(a) or shlex.quote(a) for a in args)


# What each node of a multi-node learner finds out for itself before its torchrun starts, from Slurm
# rather than from its host name (which may resolve to 127.0.1.1, or to another interface than the
# cluster's): its own address (Slurm's NodeAddr), which torchrun advertises to the other nodes
# (--local-addr, MASTER_ADDR), whether it hosts the rendezvous store (the first node; torchrun's own
# guess compares the endpoint with what the host name resolves to, and may find no host at all), and
# the interface gloo binds (GLOO_SOCKET_IFNAME, unless set: the one that holds that address).
_NODE_SETUP = [
    'ADDR="$(scontrol show node "$SLURMD_NODENAME" -o | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p")"',
    'IS_HOST=0; [ "$SLURMD_NODENAME" = "$FIRST" ] && IS_HOST=1',
    'if [ -z "${GLOO_SOCKET_IFNAME:-}" ] && [ -n "$ADDR" ] && command -v ip >/dev/null; then',
    '    IFACE="$(ip -o addr show to "$ADDR" 2>/dev/null | head -n1 | cut -d" " -f2)"',
    '    [ -n "$IFACE" ] && export GLOO_SOCKET_IFNAME="$IFACE"',
    "fi",
    'echo "learner node $SLURMD_NODENAME at ${ADDR:-?}, rendezvous host $IS_HOST, gloo ${GLOO_SOCKET_IFNAME:-}" >&2',
]


def job_name(config: RunConfig, role: str) -> str:
    return f"ddiloco-{config.run_dir.name}-{role}"


def synchronizer_script(config: RunConfig, opts: SlurmOptions, shard: int) -> str:
    """A requeueable job that restarts its shard from the checkpoint when the process dies (kill -9, OOM),
    on the port it had, so learners keep the address; a requeued job (another node) writes a new
    address file, which learners read again when the shard stops answering."""
    d = config.sync_dir(shard).resolve()
    address = shlex.quote(str(d / "address"))
    host = '"$(hostname -I | cut -d" " -f1)"' if opts.host == "auto" else shlex.quote(opts.host)
    args = [a for a in config.synchronizer_args(shard, 0)]
    args[args.index("--host") + 1] = "__HOST__"
    args[args.index("--port") + 1] = "__PORT__"
    command = _command([opts.python, "-m", "ddiloco", *args]).replace("__HOST__", host).replace("__PORT__", '"$PORT"')
    return (
        "\n".join(
            [
                *_header(job_name(config, f"sync{shard}"), d, opts, 1, True, 0),
                *_token_lines(config),
                'echo "synchronizer job $SLURM_JOB_ID start ${SLURM_RESTART_COUNT:-0} on $(hostname) at $(date +%T)" >&2',  # noqa: E501 (one shell line)
                f"rm -f {address}",
                "PORT=0",
                "STOPPING=0",
                "trap 'STOPPING=1' TERM INT  # scancel, requeue or preemption: no restart inside this job",
                f"for attempt in $(seq 0 {opts.max_restarts}); do",
                f"    srun --ntasks=1 {command} &",
                "    wait $!",
                "    rc=$?",
                '    if [ "$STOPPING" = 1 ]; then wait; exit "$rc"; fi',
                '    [ "$rc" = 0 ] && exit 0',
                f"    [ -s {address} ] && PORT=\"$(sed -n 's/.*:\\([0-9]*\\)$/\\1/p' {address})\"",
                '    echo "synchronizer exited with $rc; restart $((attempt + 1)) from its checkpoint on port $PORT" >&2',  # noqa: E501 (one shell line)
                "done",
                'exit "$rc"',
            ]
        )
        + "\n"
    )


def learner_script(config: RunConfig, opts: SlurmOptions, m: int) -> str:
    d = config.learner_dir(m).resolve()
    files = [config.sync_dir(s).resolve() / "address" for s in range(config.sync_shards)]
    wait = [
        f"for f in {' '.join(shlex.quote(str(f)) for f in files)}; do",
        f'    for _ in $(seq {opts.address_wait}); do [ -s "$f" ] && break; sleep 1; done',
        '    [ -s "$f" ] || { echo "no synchronizer address in $f" >&2; exit 1; }',
        "done",
    ]
    # @FILE: the learner reads the address files again whenever a shard stops answering (a shard moved)
    args = [*config.learner_args(m, [f"@{f}" for f in files]), "--term-grace", f"{opts.term_grace:g}"]
    scratch: list[str] = []
    if opts.learner_state == "scratch":
        args += ["--inner-state-dir", SCRATCH]
        name = shlex.quote(f"ddiloco-{config.run_dir.name}-learner{m}")
        scratch = [f'SCRATCH="${{TMPDIR:-/tmp}}/{name}-$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}"']
    ranks = opts.nodes_per_learner * opts.procs_per_node
    if ranks == 1:
        run = f"exec srun --ntasks=1 {_command([opts.python, '-m', 'ddiloco', *args])}"
        setup: list[str] = []
    else:
        setup = [
            "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1  # restarts must not read the last round's "
            "addresses (pytorch#135712)",
            'FIRST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
            'RDZV="$(scontrol show node "$FIRST" -o | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\')"',
            "PORT=$((29500 + SLURM_JOB_ID % 1000))",
            f"export FIRST RDZV PORT{' SCRATCH' if scratch else ''}  # read on every node, by the lines below",
        ]
        torchrun = [
            opts.python,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(opts.nodes_per_learner),
            "--nproc-per-node",
            str(opts.procs_per_node),
            "--max-restarts",
            str(opts.max_restarts),
            "--rdzv-backend",
            "c10d",
            "--rdzv-id",
            "__JOB__",
            "--rdzv-endpoint",
            "__RDZV__",
            "--rdzv-conf",
            "__IS_HOST__",
            "--local-addr",
            "__ADDR__",
            "-m",
            "ddiloco",
            *args,
        ]
        command = _command(torchrun)
        for mark, value in (
            ("__JOB__", '"$SLURM_JOB_ID"'),
            ("__RDZV__", '"$RDZV:$PORT"'),
            ("__IS_HOST__", "is_host=$IS_HOST"),
            ("__ADDR__", '"$ADDR"'),
        ):
            command = command.replace(mark, value)
        run = "exec srun --ntasks-per-node=1 bash -c " + shlex.quote("\n".join([*_NODE_SETUP, f"exec {command}"]))
    return (
        "\n".join(
            [
                *_header(job_name(config, f"learner{m}"), d, opts, opts.nodes_per_learner, True, opts.gpus_per_node),
                *_token_lines(config),
                'echo "learner job $SLURM_JOB_ID start ${SLURM_RESTART_COUNT:-0} on $(hostname) at $(date +%T)" >&2',
                *wait,
                *scratch,
                *setup,
                run,
            ]
        )
        + "\n"
    )


def write_scripts(config: RunConfig, opts: SlurmOptions) -> dict[str, Path]:
    """Every job's script under RUN_DIR/slurm/ (and the token file); returns role -> path."""
    out = config.run_dir / "slurm"
    out.mkdir(parents=True, exist_ok=True)
    for s in range(config.sync_shards):
        config.sync_dir(s).mkdir(parents=True, exist_ok=True)
    for m in range(config.learners):
        config.learner_dir(m).mkdir(parents=True, exist_ok=True)
    if config.token is not None:
        token = config.run_dir / "token"
        token.touch(mode=0o600, exist_ok=True)
        token.chmod(0o600)
        token.write_text(config.token)
    scripts = {f"sync{s}": synchronizer_script(config, opts, s) for s in range(config.sync_shards)}
    scripts.update({f"learner{m}": learner_script(config, opts, m) for m in range(config.learners)})
    paths = {}
    for role, text in scripts.items():
        path = out / f"{role}.sbatch"
        path.write_text(text)
        path.chmod(0o755)
        paths[role] = path
    return paths
