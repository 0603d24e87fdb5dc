"""Checks of `ddiloco run`'s options that build something from several of them (kept apart from
`run`, whose module is the command's long option list)."""

from __future__ import annotations


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
