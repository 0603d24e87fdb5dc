"""What a host's link delivers, and the kernel qdisc that makes it on one end of the link.

Each direction of a link is shaped where it leaves a device (egress), so a host's link has two
qdiscs: on the host's own end (what it sends) and on the bridge's end (what it receives). Bandwidth
is `tbf`; latency, jitter and loss are `netem` where the kernel has it (this project's does not:
there the relay of delays.py makes them), and asking netem for them where it is missing raises
NetemUnavailable: a link is never silently left unshaped.
A cut direction is the `blackhole` qdisc: every packet dropped in silence, as on a dead link.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .commands import CommandFailed, NetemUnavailable, ip, json_of, tc

RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
MTU_FRAME = 1514  # the largest frame a 1500-byte MTU puts on the wire, Ethernet header included
TBF_QUEUE = "100ms"  # how long a packet may wait in the bucket's queue before it is dropped


def _number(text: str, units: dict[str, float] | dict[str, int], what: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", text.lower())
    if not m or m.group(2) not in units:
        raise ValueError(f"{what} {text!r}: expected a number and one of {', '.join(units)}")
    return float(m.group(1)) * units[m.group(2)]


@dataclass(frozen=True)
class LinkSpec:
    """One host's link, the same in both directions: rate in bit/s (None: unshaped), one-way latency
    and jitter in seconds, loss as a fraction of packets. Latency is added in each direction of the
    link, so two hosts with 40 ms links see 80 ms one way between them."""

    rate_bps: int | None = None
    latency_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.rate_bps is not None and self.rate_bps < 8:
            raise ValueError(f"rate {self.rate_bps} bit/s: at least 8 bit/s")
        if self.latency_s < 0 or self.jitter_s < 0 or not 0 <= self.loss <= 1:
            raise ValueError(f"latency and jitter must be >= 0 and loss within 0..100 %: {self}")

    @classmethod
    def parse(cls, text: str) -> LinkSpec:
        """`"rate=100mbit,latency=80ms,jitter=10ms,loss=0.1%"`; any part may be left out."""
        fields: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key in fields:
                raise ValueError(f"link {text!r}: {part!r} is not one key=value, or is given twice")
            if key == "rate":
                fields[key] = _number(value, RATE_UNITS, "rate")
            elif key in ("latency", "jitter"):
                fields[key] = _number(value, TIME_UNITS, key)
            elif key == "loss":
                if not value.endswith("%"):
                    raise ValueError(f"loss {value!r}: a percentage, like 0.1%")
                fields[key] = _number(value[:-1], {"": 1}, "loss") / 100
            else:
                raise ValueError(f"link {text!r}: unknown key {key!r} (rate, latency, jitter, loss)")
        rate = fields.get("rate")
        return cls(
            rate_bps=None if rate is None else round(rate),
            latency_s=fields.get("latency", 0.0),
            jitter_s=fields.get("jitter", 0.0),
            loss=fields.get("loss", 0.0),
        )

    @property
    def needs_netem(self) -> bool:
        return self.latency_s > 0 or self.jitter_s > 0 or self.loss > 0

    @property
    def burst_bytes(self) -> int:
        """The token bucket's depth: 5 ms at the rate, and never under two full frames (tbf drops a
        packet larger than its bucket). A transfer of N bytes takes at least (N - burst) / rate."""
        if self.rate_bps is None:
            return 0
        return max(2 * MTU_FRAME, self.rate_bps // 8 // 200)

    def __str__(self) -> str:
        parts = [f"rate={_rate_text(self.rate_bps)}"] if self.rate_bps is not None else []
        if self.latency_s:
            parts.append(f"latency={self.latency_s * 1e3:g}ms")
        if self.jitter_s:
            parts.append(f"jitter={self.jitter_s * 1e3:g}ms")
        if self.loss:
            parts.append(f"loss={self.loss * 100:g}%")
        return ",".join(parts) or "unshaped"


def _rate_text(bps: int) -> str:
    """The largest unit that writes `bps` exactly: 100000000 is 100mbit."""
    unit = next(u for u in ("tbit", "gbit", "mbit", "kbit", "bit") if bps % RATE_UNITS[u] == 0)
    return f"{bps // RATE_UNITS[unit]}{unit}"


def qdisc_args(spec: LinkSpec, cut: bool) -> list[str] | None:
    """The root qdisc for one direction of a link, or None for the device's default (no shaping)."""
    if cut:
        return ["blackhole"]
    if spec.needs_netem:
        args = ["netem", "limit", "10000"]
        if spec.latency_s or spec.jitter_s:
            args += ["delay", f"{spec.latency_s * 1e6:.0f}us"]
            if spec.jitter_s:
                args += [f"{spec.jitter_s * 1e6:.0f}us", "distribution", "normal"]
        if spec.loss:
            args += ["loss", f"{spec.loss * 100:g}%"]
        if spec.rate_bps is not None:
            args += ["rate", f"{spec.rate_bps}bit"]
        return args
    if spec.rate_bps is not None:
        return ["tbf", "rate", f"{spec.rate_bps}bit", "burst", str(spec.burst_bytes), "latency", TBF_QUEUE]
    return None


def apply(netns: str, dev: str, spec: LinkSpec, cut: bool) -> None:
    """Put one direction's qdisc on `dev` in `netns` (replacing ours), or take ours off."""
    args = qdisc_args(spec, cut)
    if args is None:
        # Nothing to shape: back to the device's default. Fails harmlessly when no qdisc of ours is on.
        tc("qdisc", "del", "dev", dev, "root", netns=netns, check=False)
        return
    try:
        tc("qdisc", "replace", "dev", dev, "root", *args, netns=netns)
    except CommandFailed as e:
        if args[0] == "netem" and "unknown" in e.stderr.lower():
            raise NetemUnavailable(netem_missing(spec)) from e
        raise


def netem_missing(spec: LinkSpec) -> str:
    return (
        f"link {spec} needs the netem qdisc (latency, jitter, loss), and this kernel has none "
        "('Specified qdisc kind is unknown'); Network(..., delay='auto' or 'relay') makes them with the TUN relay"
    )


def netem_available(netns: str, dev: str = "lo") -> bool:
    """Try a netem qdisc on a device of ours and take it off again: the kernel is the only judge."""
    done = tc("qdisc", "replace", "dev", dev, "root", "netem", "delay", "1ms", netns=netns, check=False)
    if done.returncode != 0:
        return False
    tc("qdisc", "del", "dev", dev, "root", netns=netns, check=False)
    return True


def qdisc_drops(netns: str, dev: str) -> int:
    """Packets the qdiscs on `dev` dropped (a cut drops every packet, a full tbf queue its overflow).
    The kernel's count starts again at zero whenever the qdisc is replaced."""
    return sum(q.get("drops", 0) for q in json_of(tc("-j", "-s", "qdisc", "show", "dev", dev, netns=netns)))


def device_bytes(netns: str, dev: str) -> tuple[int, int]:
    """Bytes `dev` sent and received."""
    stats = json_of(ip("-j", "-s", "link", "show", "dev", dev, netns=netns))[0]["stats64"]
    return stats["tx"]["bytes"], stats["rx"]["bytes"]
