import pytest

from ddiloco.wire.routing import check_cover, owned_fragments, owner
from ddiloco.wire.rpc import check_address


def test_round_robin_ownership_covers_every_fragment_once():
    owned = {s: owned_fragments(s, 3, 8) for s in range(3)}
    assert owned == {0: [0, 3, 6], 1: [1, 4, 7], 2: [2, 5]}
    assert all(owner(p, 3) == s for s, ps in owned.items() for p in ps)
    check_cover(owned, 8)


def test_missing_or_duplicated_shards_are_explained():
    with pytest.raises(ValueError, match="lacks a shard"):
        check_cover({0: [0, 2]}, 4)
    with pytest.raises(ValueError, match="owned by shards 0 and 1"):
        check_cover({0: [0, 1], 1: [1]}, 2)
    with pytest.raises(ValueError, match="every shard needs a fragment"):
        owned_fragments(0, 5, 4)


@pytest.mark.parametrize("address", ["127.0.0.1:7070", "localhost:1", "[::1]:65535", "sync-0.cluster:7070"])
def test_good_addresses_pass(address):
    check_address(address)


@pytest.mark.parametrize(
    "address",
    [
        "nonsense",
        "127.0.0.1",
        ":7070",
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "a b:1",
        "[::1:7070",
        "::1:7070",
        "127.0.0.1:70x",
        "http://h:1",
    ],
)
def test_bad_addresses_are_refused_without_resolving(address):
    with pytest.raises(ValueError, match="bad synchronizer address"):
        check_address(address)
