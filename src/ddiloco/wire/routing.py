"""Which synchronizer shard owns which fragment.

Fragments are independent, so the synchronizer splits by fragment: shard s of S owns the fragments
p with p mod S == s. Round-robin rather than contiguous ranges because balanced fragmentation makes
fragments nearly equal in size and the staggered schedule syncs consecutive fragments at consecutive
steps: round-robin spreads both memory and the per-step merge load evenly over the shards.
"""

from __future__ import annotations


def owned_fragments(shard: int, num_shards: int, num_fragments: int) -> list[int]:
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard must be in [0, {num_shards}), got {shard}")
    if num_shards > num_fragments:
        raise ValueError(f"{num_shards} shards for {num_fragments} fragments: every shard needs a fragment")
    return [p for p in range(num_fragments) if p % num_shards == shard]


def owner(fragment: int, num_shards: int) -> int:
    return fragment % num_shards


def check_cover(owned_by_shard: dict[int, list[int]], num_fragments: int) -> None:
    """Every fragment owned by exactly one of the shards the learner was given."""
    seen: dict[int, int] = {}
    for shard, owned in owned_by_shard.items():
        for p in owned:
            if p in seen:
                raise ValueError(f"fragment {p} is owned by shards {seen[p]} and {shard}: check the address list")
            seen[p] = shard
    missing = sorted(set(range(num_fragments)) - set(seen))
    if missing:
        raise ValueError(f"no synchronizer shard owns fragments {missing[:8]}: the address list lacks a shard")
