"""Checks of `ddiloco run`'s options that build something from several of them (kept apart from
`run`, whose module is the command's long option list)."""

from __future__ import annotations

#: `cluster.sbatch.SlurmOptions`' fields that only a Slurm run takes: (flag, default)
SLURM_ONLY = {
    "partition": ("--partition", None),
    "account": ("--account", None),
    "time_limit": ("--time", None),
    "nodes_per_learner": ("--nodes-per-learner", 1),
    "procs_per_node": ("--procs-per-node", 1),
    "gpus_per_node": ("--gpus-per-node", 0),
    "cpus_per_task": ("--cpus-per-task", None),
    "host": ("--sync-host", "auto"),
    "extra": ("--sbatch-arg", ()),
    "max_restarts": ("--max-restarts", 2),
    "learner_state": ("--learner-state", "shared"),
}

#: the Slurm-only flags a SkyPilot run takes too (the others are refused with it)
SLURM_ONLY_ALLOWED = {"--dry-run", "--detach", "--sync-host", "--max-restarts"}


def check_backend_flags(
    backend: str, slurm_flags: dict, dry_run: bool, detach: bool, sky_given: bool, sinks: bool
) -> list[str]:
    """Refuse the flags of another backend (whatever the method) with the flags named; returns the
    Slurm-only flags given (a SkyPilot run says which of them it ignores)."""
    given = [flag for flag, on in (("--dry-run", dry_run), ("--detach", detach)) if on]
    given += [flag for key, (flag, default) in SLURM_ONLY.items() if slurm_flags[key] != default]
    if backend == "local" and given:
        raise ValueError(f"{', '.join(given)}: only with --backend slurm")
    if sinks and (backend == "skypilot" or dry_run or detach):
        raise ValueError(
            "--tensorboard, --wandb: only for a run this command follows (not skypilot, --dry-run, --detach)"
        )
    if backend != "skypilot" and sky_given:
        raise ValueError("--store, --infra, --accelerators, --no-spot, --tls, --sky-port: only with skypilot")
    return given


def kill_shard_list(spec: str, shards: int) -> tuple[int, ...]:
    """--kill-shards: "all" or a comma list of shard numbers below --sync-shards."""
    if spec.strip() == "all":
        return tuple(range(shards))
    try:
        chosen = tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise ValueError(f"--kill-shards {spec!r}: give all or shard numbers such as 0,1") from None
    if any(not 0 <= s < shards for s in chosen):
        raise ValueError(f"--kill-shards {spec!r}: shards are 0..{shards - 1} (--sync-shards {shards})")
    return chosen


def hosts_plan(network: str, links: list[str] | None, learners: int, shards: int, emulated: float):  # noqa: ANN202
    """--network hosts: the hosts and their links (checked here, made by the launcher); else None."""
    if network != "hosts":
        if links:
            raise ValueError("--link: only with --network hosts")
        return None
    from ..hosts import unavailable_reason  # the hosts part loads only for --network hosts
    from ..hosts.run import HostsPlan

    if emulated:
        raise ValueError("--network hosts shapes real links (--link); --net-latency/-bandwidth/-jitter emulate one")
    reason = unavailable_reason()
    if reason is not None:
        raise ValueError(f"--network hosts: {reason}")
    return HostsPlan.parse(links or [], learners, shards)
