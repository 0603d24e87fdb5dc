"""A learner's link threads never die silently: a bug that escapes a pusher's loop is logged with its
traceback and the loop starts again, so the learner keeps contributing (#32)."""

import logging

import pytest

from ..support.runtime import mlp_run, train_until_accepted

pytestmark = pytest.mark.timeout(120)


def test_a_pusher_that_raises_is_logged_once_and_restarted_and_pushes_go_on(caplog):
    with mlp_run(width=64) as (service, client, model):
        link = client.links[0]
        real_push = link.uplink.push
        failures = {"left": 3}

        def flaky_push(*args, **kwargs):
            if failures["left"] > 0:
                failures["left"] -= 1
                raise RuntimeError("a bug in the push path")
            return real_push(*args, **kwargs)

        link.uplink.push = flaky_push
        with caplog.at_level(logging.WARNING, logger="ddiloco.learner.link"):
            accepted = 0
            for _ in range(4):  # pushes go side by side: train on until all three failures happened
                accepted = train_until_accepted(client, model, accepted + 4, seconds=60)
                if failures["left"] == 0:
                    break
        assert failures["left"] == 0, "the push path was never reached"
        before = accepted
        assert train_until_accepted(client, model, before + 4, seconds=60) >= before + 4  # pushes go on
        assert all(t.is_alive() for t in link._threads)
        traced = [r for r in caplog.records if r.exc_info and "pusher thread failed" in r.getMessage()]
        assert len(traced) == 1  # the traceback once; the repeats are short lines
        assert "RuntimeError" in caplog.text
