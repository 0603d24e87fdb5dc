"""A finishing learner waits until its final work is merged, and is told so without the values."""

import time

import pytest
import torch

from ..support.runtime import mlp_run, train_until_accepted

pytestmark = pytest.mark.timeout(120)


def test_finish_waits_for_its_final_work_to_be_merged_but_takes_no_values():
    with mlp_run(width=256) as (service, client, model):
        assert train_until_accepted(client, model, 4) >= 4
        core = client.core
        for _ in range(500):  # until a fragment holds unsent work that finish() must flush (at most ~10 s)
            flushed = [p for p in range(2) if core.pending[p] is None and core.counters[p].steps > 0]
            if flushed:
                break
            time.sleep(0.02)
            client.step(tokens=16)
        assert flushed, (core.pending, core.counters, core.versions, service.core.versions)
        held = {p: core.versions[p] for p in flushed}
        before = client.stats()["bytes_received"]
        client.finish(timeout=30)
        assert core.pending == [None, None]  # every contribution was merged (and acknowledged)
        for p in flushed:  # merged into a newer version, whose values the leaving learner did not take
            assert service.core.versions[p] > held[p] == core.versions[p]
        fragment = sum(t.numel() for n, t in model.named_parameters() if n in client.fragment_names(flushed[0]))
        unasked = client.stats()["bytes_received"] - before
        assert unasked < 2 * fragment * (2 - len(flushed)) + 4096  # bf16: at most an update sent before the flush
        assert torch.isfinite(torch.cat([t.detach().flatten() for t in model.parameters()])).all()
