"""Many hosts on one machine, for tests, benchmarks and rehearsals: network namespaces with their own
198.18.0.0/15 addresses joined by a bridge, links shaped by the kernel (tbf), cut in one or both
directions, flapping; processes started inside a host and stopped, with every namespace, on teardown.

Modules: `network` (the hosts, their links, faults and teardown), `topology` (namespaces, bridge,
veths, addresses), `shaping` (a link's spec and its qdisc), `delays` and `relay` (latency, jitter and
loss through a TUN relay where the kernel has no netem), `faults` (the flapping timer), `processes`
(our processes, stopped by PID), `commands` (`ip`/`tc`), `run` (`ddiloco run --network hosts`: the
hosts of a run, its processes' commands, the launcher's own namespace), `probe` (what a link delivers).
Needs root and iproute2; see docs/hosts.md.
"""

from .commands import CommandFailed, HostsUnavailable, NetemUnavailable, unavailable_reason
from .faults import Flapper
from .network import Network
from .shaping import LinkSpec
from .topology import SUBNET, Host

__all__ = [
    "SUBNET",
    "CommandFailed",
    "Flapper",
    "Host",
    "HostsUnavailable",
    "LinkSpec",
    "NetemUnavailable",
    "Network",
    "unavailable_reason",
]
