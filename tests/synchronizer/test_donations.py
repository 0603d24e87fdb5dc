"""The donation desk of peer recovery: who donates, what a donor may send, when a ticket fails."""

import pytest
import torch

from ddiloco.synchronizer.donations import DonationDesk

SHAPES = {"w": (2, 3), "b": (3,)}


def desk(alive=lambda sid: True, ttl=60.0) -> DonationDesk:
    return DonationDesk(SHAPES, ttl, alive)


def test_the_live_learner_with_most_steps_donates_never_the_joiner_or_an_empty_one():
    d = desk()
    reply = d.ask(2, "s2", [(0, "s0", 10.0), (1, "s1", 30.0), (2, "s2", 99.0), (3, "s3", 0.0)])
    assert reply["ok"] and reply["donor"] == 1
    assert d.due_for("s1") == reply["ticket"] and d.due_for("s0") is None
    assert not d.ask(2, "s2", [(2, "s2", 5.0), (3, "s3", 0.0)])["ok"]  # nobody to copy from


def test_a_donor_sends_only_the_models_parameters_with_their_shapes_and_finite_scalars():
    d = desk()
    ticket = d.ask(1, "s1", [(0, "s0", 5.0)])["ticket"]
    with pytest.raises(ValueError, match="ticket"):
        d.begin(ticket, "s9")  # not this session's ticket
    d.begin(ticket, "s0")
    assert d.expected(ticket, "s0", ["w/exp_avg", "b/exp_avg_sq"]) == {"w/exp_avg": (2, 3), "b/exp_avg_sq": (3,)}
    for bad in (["x/exp_avg"], ["w/../../etc"], ["w/" + "k" * 40], [f"w/k{i}" for i in range(5)]):
        with pytest.raises(ValueError):
            d.expected(ticket, "s0", bad)
    for bad in (
        {"x": {"step": 1}},
        {"w": {"step": float("nan")}},
        {"w": {"step": 1e300}},
        {"w": {"step": True}},
        {"w": "step"},
        [],
    ):
        with pytest.raises(ValueError):
            d.check_scalars(bad)
    assert d.check_scalars({"w": {"step": 7}}) == {"w": {"step": 7.0}}


def test_ready_state_is_taken_once_and_a_dead_donor_fails_its_ticket():
    gone = set()
    d = desk(alive=lambda sid: sid not in gone)
    t1 = d.ask(1, "s1", [(0, "s0", 5.0), (2, "s2", 3.0)])["ticket"]
    gone.add("s0")
    assert d.poll(t1, "s1")["state"] == "failed"
    t2 = d.ask(1, "s1", [(0, "s0", 5.0), (2, "s2", 3.0)])  # s0 failed once: never asked again
    assert t2["donor"] == 2
    d.begin(t2["ticket"], "s2")
    d.complete(t2["ticket"], {"w/exp_avg": torch.ones(2, 3)}, {"w": {"step": 4.0}}, "abc")
    assert d.poll(t2["ticket"], "s1")["state"] == "ready"
    with pytest.raises(ValueError):
        d.take(t2["ticket"], "s0")  # only the joiner takes it
    taken = d.take(t2["ticket"], "s1")
    assert taken.step == 4.0 and torch.equal(taken.tensors["w/exp_avg"], torch.ones(2, 3))
    with pytest.raises(ValueError):
        d.take(t2["ticket"], "s1")
    assert d.summary()["donated"] == 1 and d.summary()["failed"] == 1


def test_a_ticket_expires():
    d = desk(ttl=0.0)
    ticket = d.ask(1, "s1", [(0, "s0", 5.0)])["ticket"]
    assert d.poll(ticket, "s1")["state"] == "failed"


def test_hostile_donations_are_refused_and_never_reach_the_joiner(tiny_task):
    """Over the wire: a NaN state, a state that does not match its checksum, a forged ticket."""
    import grpc

    from ddiloco.wire import framing
    from ddiloco.wire.protocol import signature, state_checksum

    from ..support.runtime import RawClient, rpc_error, synchronizer

    sig = signature(dict(tiny_task.build_model(0).named_parameters()))
    with synchronizer(tiny_task) as (service, address):
        c = RawClient(address)
        sessions = {m: c.register(m, sig, incarnation=f"i{m}")["session"] for m in range(3)}
        for m in (0, 1):  # two donors that have trained
            c.call("Heartbeat", {"session": sessions[m], "step": 10 + m, "state": "training"})
        name, shape = next(iter(service.shapes.items()))
        good = {f"{name}/exp_avg": torch.ones(shape)}
        scalars = {name: {"step": 10.0}}

        def donate(m: int, ticket: str, tensors: dict, checksum: str):
            head = {
                "kind": "inner_state",
                "session": sessions[m],
                "ticket": ticket,
                "scalars": scalars,
                "checksum": checksum,
            }
            frames = framing.tensor_frames(head, tensors, "fp32")
            return c.stubs.donate(iter(frames), timeout=10, metadata=c.stubs.metadata)

        for attempt, (tensors, checksum) in enumerate(
            [
                ({f"{name}/exp_avg": torch.full(shape, float("nan"))}, None),  # NaN moments
                (good, "0" * 64),  # does not match its checksum
            ]
        ):
            ask = c.call("Donor", {"session": sessions[2], "op": "ask"})
            donor = ask["donor"]
            assert donor == 1 - attempt  # the most steps first; a failed donor is not asked again
            beat = c.call("Heartbeat", {"session": sessions[donor], "step": 11, "state": "training"})
            assert beat["donate"] == ask["ticket"]
            forged = rpc_error(lambda: donate(2, ask["ticket"], good, state_checksum(good, scalars)))
            assert forged.code() == grpc.StatusCode.INVALID_ARGUMENT  # only the asked donor may send
            err = rpc_error(lambda: donate(donor, ask["ticket"], tensors, checksum or state_checksum(tensors, scalars)))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert c.call("Donor", {"session": sessions[2], "op": "poll", "ticket": ask["ticket"]})["state"] == "failed"
            taken = rpc_error(
                lambda: list(
                    c.stubs.recover(
                        framing.message({"session": sessions[2], "ticket": ask["ticket"]}),
                        timeout=10,
                        metadata=c.stubs.metadata,
                    )
                )
            )
            assert taken.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert not c.call("Donor", {"session": sessions[2], "op": "ask"})["ok"]  # both donors failed once
        c.close()


def test_a_new_request_drops_the_joiners_older_tickets_and_status_lists_a_bounded_few():
    """Issue 32, item 8: superseded tickets used to stay for their time-to-live, all listed in Status."""
    d = desk()
    for _ in range(2000):
        last = d.ask(1, "s1", [(0, "s0", 5.0)])["ticket"]
    assert list(d.tickets) == [last] and d.due_for("s0") == last
    for joiner in range(100, 200):  # many joiners at once: Status counts them all, lists the newest
        d.ask(joiner, f"s{joiner}", [(0, "s0", 5.0)])
    summary = d.summary()
    assert summary["tickets"] == 101 and len(summary["open"]) == 32


def test_a_session_asking_in_a_loop_keeps_status_small_and_the_log_quiet(tiny_task, caplog):
    """Over the wire: 2000 asks of one session leave one ticket, a small Status, a few log lines."""
    import logging
    import time

    from ddiloco.wire import framing
    from ddiloco.wire.protocol import signature
    from ddiloco.wire.timeouts import Timeouts

    from ..support.runtime import RawClient, synchronizer

    sig = signature(dict(tiny_task.build_model(0).named_parameters()))
    caplog.set_level(logging.INFO, logger="ddiloco.synchronizer.donation_rpc")
    with synchronizer(tiny_task, timeouts=Timeouts.derive(3.0)) as (service, address):  # the issue's --heartbeat 3
        c = RawClient(address)
        try:
            donor, joiner = (c.register(m, sig, incarnation=f"i{m}")["session"] for m in range(2))
            c.call("Heartbeat", {"session": donor, "step": 10, "state": "training"})
            started = time.monotonic()
            for i in range(2000):
                ask = c.call("Donor", {"session": joiner, "op": "ask"})
                assert ask["ok"], ask
                if i % 200 == 0:  # keep both sessions alive however slow the machine is
                    c.call("Heartbeat", {"session": donor, "step": 10, "state": "training"})
                    c.call("Heartbeat", {"session": joiner, "step": 0, "state": "joining"})
            elapsed = time.monotonic() - started
            assert list(service.donations.tickets) == [ask["ticket"]]
            reply = c.stubs.call("Status", framing.message({}), 10)
            assert len(reply) < 16 << 10, len(reply)  # the header limit is 1 MiB
            assert framing.read_message(reply)["donations"]["tickets"] == 1
            poll = c.call("Donor", {"session": joiner, "op": "poll", "ticket": ask["ticket"]})
            assert poll["state"] == "asked"
        finally:
            c.close()
    lines = [r for r in caplog.records if "asks for inner state" in r.getMessage()]
    assert 1 <= len(lines) <= 10 + elapsed + 1  # the bucket: a burst of 10, then one a second
