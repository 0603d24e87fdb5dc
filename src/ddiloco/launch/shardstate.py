"""The live state of one hand-started synchronizer shard (`ddiloco synchronizer --dashboard`), in the
keys of `livestate.snapshot`, so that the dashboard page of `ddiloco run` shows it unchanged.

A shard knows no learner processes, only sessions: a learner is "joining" from its registration to
its first step, "running" while its session is live, "gone" once declared failed or left. The loss
curve is the learners' training loss they report with their steps (the shard holds no data to
evaluate on), sampled at most once a second when the page asks.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable

from .livestate import goodput_so_far


class ShardState:
    def __init__(
        self,
        status: Callable[[], dict],
        method: str,
        learners: int,
        duration: float | None = None,
        token_budget: int | None = None,
        sample_every: float = 1.0,
    ) -> None:
        self.status, self.method, self.learners = status, method, learners
        self.duration, self.token_budget, self.sample_every = duration, token_budget, sample_every
        self.history: deque[dict] = deque(maxlen=5000)
        self._last_sample = float("-inf")

    def __call__(self) -> dict:
        st, now = self.status(), time.time()
        rows = self.learner_rows(st)
        self._sample(st, rows, now)
        return {
            "method": self.method,
            "elapsed": now - float(st.get("started_wall") or now),
            "duration": self.duration,
            "tokens": int(st.get("tokens_reported", 0)),
            "token_budget": self.token_budget,
            "version": int(st.get("version_sum", 0)),
            "merges": int(st.get("merges", 0)),
            "goodput": goodput_so_far([st], self.learners, now),
            "stall_seconds_max": float(st.get("stall_seconds_max", 0.0)),
            "eval_loss": None,
            "learner_restarts": None,
            "stopping": bool(st.get("stopping")),
            "learners": rows,
            "shards": [{"index": st.get("shard", 0), "state": "running", "pid": os.getpid(), "restarts": 0}],
            "history": list(self.history),
        }

    @staticmethod
    def learner_rows(st: dict) -> list[dict]:
        live = {int(m) for m in st.get("live", [])}
        sessions, books = st.get("learners", {}), st.get("books", {})
        rows = []
        for m in sorted({int(k) for k in sessions} | {int(k) for k in books}):
            info, book = sessions.get(str(m), {}), books.get(str(m), {})
            state = "gone" if m not in live else ("running" if info.get("step") else "joining")
            rows.append(
                {
                    "id": m,
                    "state": state,
                    "pid": None,
                    "restarts": None,
                    "step": info.get("step"),
                    "tokens": info.get("tokens"),
                    "tokens_trained": book.get("tokens_trained", 0),
                    "tokens_merged": book.get("tokens_merged", 0.0),
                    "loss": info.get("loss"),
                    "last_merge_wall": info.get("last_merge_wall"),
                }
            )
        return rows

    def _sample(self, st: dict, rows: list[dict], now: float) -> None:
        losses = [r["loss"] for r in rows if r["state"] == "running" and isinstance(r["loss"], (int, float))]
        if losses and now - self._last_sample >= self.sample_every:
            self._last_sample = now
            self.history.append(
                {
                    "kind": "train",
                    "t": now - float(st.get("started_wall") or now),
                    "tokens": int(st.get("tokens_reported", 0)),
                    "train_loss": sum(losses) / len(losses),
                }
            )
