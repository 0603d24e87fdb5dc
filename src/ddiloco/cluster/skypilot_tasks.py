"""The SkyPilot task YAMLs of a run: one on-demand task for the synchronizer shards, one managed job
per learner (spot, recovered by SkyPilot's `job_recovery`), each learner on its own infra and
accelerators if asked (mixed hardware is part of the method).

They run the commands `ddiloco run` starts on one machine (`RunConfig.synchronizer_args` /
`learner_args`), with the run directory on a store every task mounts ($DDILOCO_RUN): a bucket
(MOUNT mode), a volume, or a path every node already sees (a Slurm cluster's shared home). The
synchronizer task writes each shard's published address there (`sync-S/address`); learners connect
with `@FILE`, so a shard restarted elsewhere is followed as with the address files on Slurm. The
auth token is a SkyPilot secret ($DDILOCO_TOKEN), never on a command line. When the synchronizer
is reachable beyond a private network its ports are opened and TLS is on: its task signs a server
certificate for the address it publishes with the run's own CA; learners get only the CA's cert.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..launch.config import RunConfig
from . import skypilot_scripts as scripts
from .skypilot_yaml import dump

RUN = "__DDILOCO_RUN__"  # replaced by "$DDILOCO_RUN" in the scripts: the store's path on each node
STATE = "__DDILOCO_STATE__"  # replaced by "$STATE": the synchronizer node's own folder (key, local addresses)
PRIVATE_INFRA = ("kubernetes", "k8s", "slurm", "ssh")  # one private network when every task is on one of these
TLS_MOUNT = "/ddiloco-tls"  # the synchronizer's copy of the run's CA (cert and key)
CA_MOUNT = "/ddiloco-tls-ca"  # the learners' copy: the CA's certificate only


@dataclass(frozen=True)
class SkyOptions:
    """What SkyPilot needs beyond the run itself. `infra` and `accelerators` map a role ("sync",
    "learner" for every learner, "learnerM" for one) to SkyPilot's values."""

    store: str | None = None  # s3://, gs://, r2://, ... (mounted), volume:NAME, or a path every node sees
    infra: dict[str, str] = field(default_factory=dict)
    accelerators: dict[str, str] = field(default_factory=dict)
    spot: bool = True  # learners on spot capacity; the synchronizer is always on-demand
    tls: bool | None = None  # None: on unless every task is on one private infra (Kubernetes, Slurm)
    host: str = "auto"  # the address the synchronizer publishes; auto: found at launch
    port: int = 7070  # shard S listens on port + S (gRPC) and port + 100 + S (bulk socket): opened ports
    python: str = "python3"
    setup: str | None = None  # the setup script; default: install this ddiloco on each node
    term_grace: float = 20.0
    max_restarts: int = 2  # shard restarts inside its task; learner restarts on errors (job_recovery)
    address_wait: int = 1800  # seconds a learner waits for the published addresses

    def __post_init__(self) -> None:
        if not 1024 <= self.port <= 65000:
            raise ValueError("--sky-port must be in 1024..65000 (shard S uses port+S and port+100+S)")
        if self.max_restarts < 0 or self.term_grace <= 0 or self.address_wait < 1:
            raise ValueError("--max-restarts must be >= 0 and --term-grace > 0")
        for role in (*self.infra, *self.accelerators):
            if role not in ("", "sync", "learner") and not (role.startswith("learner") and role[7:].isdigit()):
                raise ValueError(f"{role!r}: give a value for all, or ROLE=VALUE with ROLE sync, learner or learnerM")

    def role_value(self, values: dict[str, str], role: str) -> str | None:
        general = "sync" if role == "sync" else "learner"
        return values.get(role) or values.get(general) or values.get("")

    def public(self, learners: int) -> bool:
        """True when the synchronizer must be reachable beyond one private network: TLS on."""
        if self.tls is not None:
            return self.tls
        roles = ["sync", *(f"learner{m}" for m in range(learners))]
        infras = {(self.role_value(self.infra, r) or "").split("/")[0] for r in roles}
        return not (len(infras) == 1 and next(iter(infras)) in PRIVATE_INFRA)


def slug(config: RunConfig) -> str:
    """The run's name as SkyPilot takes cluster and job names: lower case, digits and dashes."""
    return "ddiloco-" + (re.sub(r"[^a-z0-9-]+", "-", config.run_dir.resolve().name.lower()).strip("-") or "run")


def parse_roles(values: list[str] | None, flag: str, learners: int) -> dict[str, str]:
    """["aws/us-east-1", "learner1=gcp", "sync=aws"] -> {"": "aws/us-east-1", "learner1": "gcp", "sync": "aws"}."""
    out: dict[str, str] = {}
    for value in values or []:
        role, _, rest = value.partition("=") if "=" in value.split("/")[0] else ("", "", value)
        if not rest.strip():
            raise ValueError(f"{flag} {value!r}: give VALUE or ROLE=VALUE")
        if role.startswith("learner") and role[7:].isdigit() and int(role[7:]) >= learners:
            raise ValueError(f"{flag} {value!r}: learners are learner0..learner{learners - 1}")
        out[role] = rest.strip()
    return out


def store_mount(opts: SkyOptions) -> tuple[str, dict, dict]:
    """($DDILOCO_RUN on the nodes, file_mounts, volumes) for the run's store."""
    store = opts.store
    if store is None:
        return "/ddiloco", {}, {}
    if store.startswith("volume:"):
        return "/ddiloco", {}, {"/ddiloco": store[len("volume:") :]}
    if "://" in store:
        return "/ddiloco", {"/ddiloco": {"source": store, "mode": "MOUNT"}}, {}
    return store, {}, {}  # a path every node sees already


def _word(arg: str, names: tuple[tuple[str, str], ...]) -> str:
    if not names:
        return shlex.quote(arg) if arg else ""
    (mark, variable), rest = names[0], names[1:]
    return f'"${variable}"'.join(_word(part, rest) for part in arg.split(mark))


def _words(args: list[str]) -> str:
    """A shell command line; `RUN` and `STATE` inside an argument become "$DDILOCO_RUN" and "$STATE"."""
    return " ".join(_word(a, ((RUN, "DDILOCO_RUN"), (STATE, "STATE"))) for a in args)


def _setup(opts: SkyOptions) -> tuple[str, str | None]:
    """(setup script, workdir): a source checkout is synced and installed, else the released package."""
    if opts.setup is not None:
        return opts.setup, None
    from ..version import __version__

    source = Path(__file__).resolve().parents[3]
    if (source / "pyproject.toml").is_file() and (source / "src" / "ddiloco").is_dir():
        return f"{opts.python} -m pip install --quiet .\n", str(source)
    return f"{opts.python} -m pip install --quiet 'ddiloco=={__version__}'\n", None


def _task(name: str, opts: SkyOptions, resources: dict, envs: dict, mounts: dict, run: str) -> dict:
    setup, workdir = _setup(opts)
    run_path, store_mounts, volumes = store_mount(opts)
    task: dict = {"name": name, "resources": resources}
    if workdir:
        task["workdir"] = workdir
    task["envs"] = {"DDILOCO_RUN": run_path, "DDILOCO_PYTHON": opts.python, **envs}
    task["secrets"] = {"DDILOCO_TOKEN": None}  # required: sky launch / sky jobs launch --secret DDILOCO_TOKEN
    if store_mounts or mounts:
        task["file_mounts"] = {**store_mounts, **mounts}
    if volumes:
        task["volumes"] = volumes
    task["setup"] = setup
    task["run"] = run
    return task


def sync_task(config: RunConfig, opts: SkyOptions, tls_dir: Path | None) -> dict:
    """One task, one on-demand node, every shard: restarted in the task from its checkpoint."""
    remote = dataclasses.replace(config, run_dir=Path(RUN))
    commands = []
    for s in range(config.sync_shards):
        args = remote.synchronizer_args(s, 0, settings_file=False)  # the run directory is the store's
        args[args.index("--host") + 1] = "0.0.0.0"  # bound everywhere; the address published is $HOST
        args[args.index("--port") + 1] = str(opts.port + s)
        args[args.index("--address-file") + 1] = f"{STATE}/address-{s}"
        args += ["--bulk-port", str(opts.port + 100 + s)]
        commands.append('"$DDILOCO_PYTHON" ' + _words(["-m", "ddiloco", *args]) + ' "${TLS[@]}"')
    public = opts.public(config.learners)
    resources: dict = {"use_spot": False}
    for key, values in (("infra", opts.infra), ("accelerators", opts.accelerators)):
        if opts.role_value(values, "sync"):
            resources[key] = opts.role_value(values, "sync")
    if public:
        resources["ports"] = [f"{opts.port}-{opts.port + config.sync_shards - 1}"] + [
            f"{opts.port + 100}-{opts.port + 100 + config.sync_shards - 1}"
        ]
    envs = {
        "DDILOCO_ADVERTISE": opts.host,
        "DDILOCO_PUBLIC": "1" if public else "0",
        "DDILOCO_TLS": TLS_MOUNT if tls_dir is not None else "",
        "DDILOCO_STATE": f"~/.ddiloco/{slug(config)}",
    }
    mounts = {TLS_MOUNT: str(tls_dir)} if tls_dir is not None else {}
    run = scripts.synchronizer(commands, [opts.port + s for s in range(config.sync_shards)], opts.max_restarts)
    return _task(f"{slug(config)}-sync", opts, resources, envs, mounts, run)


def learner_task(config: RunConfig, opts: SkyOptions, m: int, ca_dir: Path | None) -> dict:
    """A managed job: on spot, recovered (new node, any region) by SkyPilot; its state on the store."""
    remote = dataclasses.replace(config, run_dir=Path(RUN))
    files = [f"{RUN}/sync-{s}/address" for s in range(config.sync_shards)]
    args = [
        *remote.learner_args(m, [f"@{f}" for f in files], settings_file=False),
        "--term-grace",
        f"{opts.term_grace:g}",
    ]
    command = '"$DDILOCO_PYTHON" ' + _words(["-m", "ddiloco", *args])
    if ca_dir is not None:
        command += ' --tls-ca "$DDILOCO_TLS_CA"'
    infra = opts.role_value(opts.infra, f"learner{m}") or ""
    # Kubernetes and Slurm have no spot instances: there the scheduler's preemption is what happens
    resources: dict = {"use_spot": opts.spot and infra.split("/")[0] not in PRIVATE_INFRA}
    for key, values in (("infra", opts.infra), ("accelerators", opts.accelerators)):
        if opts.role_value(values, f"learner{m}"):
            resources[key] = opts.role_value(values, f"learner{m}")
    resources["job_recovery"] = {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": opts.max_restarts}
    envs = {"DDILOCO_TLS_CA": f"{CA_MOUNT}/ca.pem" if ca_dir is not None else ""}
    mounts = {CA_MOUNT: str(ca_dir)} if ca_dir is not None else {}
    run = scripts.learner(m, [_words([f]) for f in files], command, opts.address_wait)
    return _task(f"{slug(config)}-learner{m}", opts, resources, envs, mounts, run)


def write_tasks(config: RunConfig, opts: SkyOptions) -> dict[str, Path]:
    """Every task's YAML under RUN_DIR/skypilot/ (and the run's CA when TLS is on); role -> path."""
    out = config.run_dir / "skypilot"
    out.mkdir(parents=True, exist_ok=True)
    tls_dir = ca_dir = None
    if opts.public(config.learners):
        tls_dir, ca_dir = scripts.make_ca(out)
    tasks = {"sync": sync_task(config, opts, tls_dir)}
    tasks.update({f"learner{m}": learner_task(config, opts, m, ca_dir) for m in range(config.learners)})
    paths = {}
    for role, task in tasks.items():
        path = out / f"{role}.yaml"
        kind = "the synchronizer shards: sky launch" if role == "sync" else "a learner: sky jobs launch"
        path.write_text(dump(task, f"ddiloco run --backend skypilot: {kind}, --secret DDILOCO_TOKEN"))
        paths[role] = path
    return paths
