"""Link specs, read from text as the CLI would pass them, and the qdisc each one becomes (no root)."""

from __future__ import annotations

import pytest

from ddiloco.hosts import LinkSpec
from ddiloco.hosts.shaping import qdisc_args


def test_a_link_spec_reads_every_part():
    spec = LinkSpec.parse("latency=80ms, jitter=10ms,rate=1gbit,loss=0.1%")
    assert spec == LinkSpec(rate_bps=10**9, latency_s=0.08, jitter_s=0.01, loss=0.001)
    assert spec.needs_netem and LinkSpec.parse(str(spec)) == spec
    assert LinkSpec.parse("") == LinkSpec() and str(LinkSpec()) == "unshaped"
    assert LinkSpec.parse("rate=2.5mbit").rate_bps == 2_500_000


@pytest.mark.parametrize(
    "text",
    ["rate=10", "rate=10mbps", "latency=5", "loss=1", "loss=101%", "speed=1mbit", "rate", "rate=1mbit,rate=2mbit"],
)
def test_bad_link_specs_are_refused_by_name(text):
    with pytest.raises(ValueError):
        LinkSpec.parse(text)


def test_each_spec_becomes_its_qdisc():
    rate = LinkSpec(rate_bps=8_000_000)
    assert qdisc_args(rate, cut=False)[:3] == ["tbf", "rate", "8000000bit"]
    assert int(qdisc_args(rate, cut=False)[4]) == rate.burst_bytes >= 2 * 1514
    assert qdisc_args(rate, cut=True) == ["blackhole"]
    assert qdisc_args(LinkSpec(), cut=False) is None
    netem = qdisc_args(LinkSpec(rate_bps=10**6, latency_s=0.05, jitter_s=0.005, loss=0.01), cut=False)
    assert netem[0] == "netem" and "delay" in netem and "loss" in netem and "rate" in netem
