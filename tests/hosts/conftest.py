"""Networks of hosts for the tests: skipped with the reason where this machine cannot make them, and
checked after each test: no namespace with the network's prefix and no process it started is left."""

from __future__ import annotations

import pytest

from ddiloco.hosts import HostsUnavailable, Network, unavailable_reason
from ddiloco.hosts.commands import netns_names

from .peering import alive


@pytest.fixture()
def make_network():
    made: list[Network] = []

    def make(names, link=None, **kwargs) -> Network:
        reason = unavailable_reason()
        if reason is not None:
            pytest.skip(reason)
        try:
            net = Network(names, link, **kwargs)
        except HostsUnavailable as e:
            pytest.skip(str(e))
        made.append(net)
        return net

    yield make
    for net in made:
        pids = net.processes.pids
        net.close()
        assert not [n for n in netns_names() if n.startswith(net.prefix)], "namespaces left behind"
        assert not [p for p in pids if alive(p)], "processes left behind"
