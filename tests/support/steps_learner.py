"""A learner process that trains a fixed number of steps and ends its loop: no token budget, no Stop
(issue #47). Its learning rate warms up and decays to zero by cosine over its own steps, as a loop of a
known length schedules it. The learners step together (each writes its step count beside OUT and waits,
bounded, until every other has made as many): on a shared CPU one learner could otherwise end dozens
of steps after the other, and its tail would be real training. A learner given EXTRA steps takes
them once every other learner has finished (its OUT written): it ends last, by a tail of a known length.
It writes {"steps", "finish"} (the `finish()` stats) to OUT.

Usage: python steps_learner.py ADDRESS LEARNER LEARNERS STEPS EXTRA DATA OUT"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

import ddiloco
from ddiloco.train.inner import InnerConfig, inner_step, lr_at, make_inner_optimizer, set_lr
from ddiloco.train.tasks import make_task
from ddiloco.wire.timeouts import Timeouts

BATCH = 8


def step_together(here: Path, learner: int, learners: int, step: int, seconds: float = 60.0) -> None:
    """Say that this learner made `step` steps; wait (bounded) until every other learner has too."""
    mine = here / f"step-{learner}"
    (here / f".step-{learner}").write_text(str(step))
    os.replace(here / f".step-{learner}", mine)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        counts = [(here / f"step-{m}").read_text() if (here / f"step-{m}").is_file() else "-1" for m in range(learners)]
        if min(int(c or -1) for c in counts) >= step:
            return
        time.sleep(0.002)
    raise TimeoutError(f"learner {learner}: the others did not reach step {step} in {seconds:g} s")


def main(address: str, learner: int, learners: int, steps: int, extra: int, data: str, out: str) -> None:
    torch.set_num_threads(1)
    task = make_task("gpt", data, seq_len=16, model_size="tiny")
    model = task.build_model(100 + learner)
    inner = InnerConfig(batch_size=BATCH, min_lr_ratio=0.0)  # to zero by the loop's end
    optimizer = make_inner_optimizer(model, inner)
    client = ddiloco.LearnerClient(model, address, learner, timeouts=Timeouts.derive(0.1))
    stream = task.stream(learner, learners, BATCH, 0)
    stream.seek(client.start())
    here = Path(out).parent
    step_together(here, learner, learners, 0)
    for step in range(steps + extra):
        if step == steps:  # the others end their loops first
            others = [here / f"{m}.json" for m in range(learners) if m != learner]
            deadline = time.monotonic() + 60
            while not all(o.is_file() for o in others) and time.monotonic() < deadline:
                time.sleep(0.01)
        set_lr(optimizer, lr_at(inner, step, step / (steps + extra)))
        batch = stream.next()
        inner_step(model, optimizer, task.loss(model, batch), 1.0)
        client.step(batch.tokens, position=stream.position)
        if step < steps:
            step_together(here, learner, learners, step + 1)
    stats = client.finish(timeout=30)
    Path(out).write_text(json.dumps({"steps": steps + extra, "finish": stats}, default=str))


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:6]), sys.argv[6], sys.argv[7])
