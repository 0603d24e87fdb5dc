"""Networks of hosts for the tests: skipped with the reason where this machine cannot make them, and
checked after each test (or module, for `network_for_module`): no namespace with the network's prefix
and no process it started is left."""

from __future__ import annotations

import pytest

from ddiloco.hosts import HostsUnavailable, Network, unavailable_reason
from ddiloco.hosts.commands import netns_names

from .peering import alive


def new_network(names, link=None, **kwargs) -> Network:
    """A network, or the test skipped with the reason this machine cannot make one."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    try:
        return Network(names, link, **kwargs)
    except HostsUnavailable as e:
        pytest.skip(str(e))


def close_and_check(net: Network) -> None:
    """Close `net`; fail if a namespace it made or a process it started is left."""
    pids = net.processes.pids
    net.close()
    assert not [n for n in netns_names() if n.startswith(net.prefix)], "namespaces left behind"
    assert not [p for p in pids if alive(p)], "processes left behind"


@pytest.fixture()
def make_network():
    made: list[Network] = []

    def make(names, link=None, **kwargs) -> Network:
        net = new_network(names, link, **kwargs)
        made.append(net)
        return net

    yield make
    for net in made:
        close_and_check(net)
