"""`ddiloco.Synchronizer`: a synchronizer shard started from a model object, in a few lines.

    sync = ddiloco.Synchronizer(model, learners=2, tokens=1_000_000, checkpoint_dir="ckpt")
    address = sync.start()      # "127.0.0.1:<port>"; hand it to the learners' LearnerClient
    sync.wait()                 # until the budget is reached (or sync.stop())

The same service `ddiloco synchronizer` runs: embeddings are found in the model, the number of
fragments fits the model, every algorithm setting is an `AlgorithmConfig` field.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from ..core.config import AlgorithmConfig
from ..core.fragments import plan_by_names
from ..synchronizer.server import SynchronizerServer, build_service
from ..synchronizer.settings import ServiceSettings
from ..wire.timeouts import Timeouts
from .model import (
    balance_note,
    check_plain_names,
    embedding_names,
    fit_fragments,
    parameters,
)

log = logging.getLogger(__name__)


class Synchronizer:
    def __init__(
        self,
        model: torch.nn.Module | Mapping[str, torch.Tensor],
        *,
        learners: int = 4,
        host: str = "127.0.0.1",
        port: int = 0,
        fragments: int | Sequence[Sequence[str]] | None = None,
        plain_names: list[str] | None = None,
        algorithm: AlgorithmConfig | None = None,
        tokens: int | None = None,
        duration: float | None = None,
        budget_counts: str = "trained",
        checkpoint_dir: str | Path | None = None,
        keep_versions: int = 2,
        event_log: str | Path | None = None,
        token: str | None = None,
        heartbeat: float = 0.5,
        min_bandwidth: float = 10e6,
        codec_down: str = "bf16",
        **knobs: object,
    ) -> None:
        """`knobs` are AlgorithmConfig fields (sync_every, overlap, quorum, grace, outer_lr, ...).
        Embeddings: `plain_names`, else every nn.Embedding of `model` and the weights tied to one.
        `tokens` counts what `budget_counts` says: "trained" (every token learners trained) or "merged".
        `min_bandwidth`: bytes/s of the slowest link a push or fetch may travel (its deadline).
        `codec_down`: how updates travel to learners, "bf16" (half the bytes), "fp32" (exact), or "int8" /
        "int4": quantised differences from the version a learner holds, with error feedback.
        `fragments`: how many (balanced by size), or the fragments themselves, each a list of parameter
        names (layer-wise from module names: `integrations.fragments.layer_fragments`); checked here."""
        params = parameters(model)
        if plain_names is not None:
            plain = check_plain_names(plain_names, params)
        else:
            plain = embedding_names(model) if isinstance(model, torch.nn.Module) else frozenset()
        base = algorithm or AlgorithmConfig()
        unknown = set(knobs) - {f.name for f in dataclasses.fields(AlgorithmConfig)}
        if unknown:
            raise TypeError(
                f"unknown settings {sorted(unknown)}; AlgorithmConfig has "
                f"{[f.name for f in dataclasses.fields(AlgorithmConfig)]}"
            )
        by_name = None
        count = fragments if fragments is None or isinstance(fragments, int) else None
        if fragments is not None and not isinstance(fragments, int):
            by_name = [list(group) for group in plan_by_names(params, fragments).names]  # checked: each once
            count = len(by_name)
        requested = count if count is not None else (base.fragments if algorithm is not None else None)
        sync_every = int(knobs.get("sync_every", base.sync_every))  # type: ignore[call-overload]
        fitted = fit_fragments(len(params), requested, sync_every)
        self.algorithm = dataclasses.replace(base, fragments=fitted, **knobs)  # type: ignore[arg-type]  # names checked above
        note = balance_note(params, self.algorithm.fragments) if by_name is None else None
        if note:
            log.warning(note)
        self.settings = ServiceSettings(
            max_learners=learners,
            tokens=tokens,
            duration=duration,
            timeouts=Timeouts.derive(heartbeat, min_bandwidth=min_bandwidth),
            keep_versions=keep_versions,
            budget_counts=budget_counts,
            codec_down=codec_down,
        )
        self.service = build_service(
            params, self.algorithm, self.settings, plain, checkpoint_dir, event_log, fragment_names=by_name
        )
        self.plain_names = plain
        self._server = SynchronizerServer(self.service, host, port, token)
        self.address: str | None = None

    def start(self) -> str:
        """Listen; returns "host:port"."""
        self.address = self._server.start()
        return self.address

    def status(self) -> dict:
        return self.service.status()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run is over (budget reached, or stopped and drained); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.service.finished.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self.service.finished.wait(0.5 if left is None else min(0.5, left))
        return True

    def request_stop(self, reason: str = "stop requested") -> None:
        """End the run: learners are told to send what they hold and leave."""
        self.service.begin_stop(reason)

    def stop(self) -> None:
        """Final checkpoint, then close the server."""
        self._server.stop()

    def __enter__(self) -> Synchronizer:
        if self.address is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
