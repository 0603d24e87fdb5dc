"""Issue 29's acceptance for Lightning: two learner processes, each a `Trainer(callbacks=[DecoupledDiLoCo(...)])`,
train through a synchronizer until its budget stops them; it merged both learners' work."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning", reason="the Lightning extra: pip install -e '.[lightning]'")

import ddiloco  # noqa: E402

from ..support.processes import wait_exit  # noqa: E402
from . import lightning_learner  # noqa: E402

SCRIPT = Path(lightning_learner.__file__)
STEP_TOKENS = lightning_learner.SEQ * lightning_learner.BATCH


@pytest.mark.timeout(180)
def test_two_lightning_learners_merge_and_count_their_steps(procs, tmp_path, corpus_file):
    budget = 80 * STEP_TOKENS
    sync = ddiloco.Synchronizer(
        lightning_learner.TinyLM(),
        learners=2,
        tokens=budget,
        sync_every=4,
        overlap=1,
        quorum=1,
        grace=0.0,
        heartbeat=0.1,
    )
    address = sync.start()
    procs.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    outs, children = [], []
    try:
        for m in range(2):
            out = tmp_path / f"learner-{m}"
            out.mkdir()
            cmd = [sys.executable, str(SCRIPT), "--connect", address, "--id", str(m), "--data", corpus_file]
            cmd += ["--ready", str(tmp_path), "--peers", "2", "--step-seconds", "0.03"]
            children.append(procs.start(f"learner-{m}", [*cmd, "--out", str(out)], out / "stderr.log"))
            outs.append(out)
        codes = wait_exit(children, 150)
        status = sync.status()
    finally:
        sync.stop()
    assert codes == [0, 0], [(o / "stderr.log").read_text()[-3000:] for o in outs]
    books = status["books"]
    assert status["merges"] > 0 and status["finished"]
    assert all(books[str(m)]["contributions"] > 0 and books[str(m)]["tokens_merged"] > 0 for m in (0, 1)), books
    for m, out in enumerate(outs):
        r = json.loads((out / "rank-0.json").read_text())
        assert 0 < r["global_step"] < 500, r  # the budget stopped it
        assert r["client"]["steps"] == r["global_step"] and r["client"]["tokens"] == r["global_step"] * STEP_TOKENS
        assert books[str(m)]["tokens_trained"] == r["client"]["tokens"]
