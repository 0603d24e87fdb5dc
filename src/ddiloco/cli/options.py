"""Command-line options shared by the commands that run the algorithm, defined once.

Defaults come from `AlgorithmConfig` itself, so `ddiloco sim`, `ddiloco run` and
`ddiloco synchronizer` cannot drift apart from the core or from each other.
"""

from __future__ import annotations

import typer

from ..core.config import AlgorithmConfig

_D = AlgorithmConfig()

LEARNERS = typer.Option(4, "--learners", "-M", help="Number of learners M (the paper uses 8).")
FRAGMENTS = typer.Option(_D.fragments, "--fragments", "-P", help="Fragments P (ignored by --method diloco).")
SYNC_EVERY = typer.Option(_D.sync_every, "--sync-every", "-H", help="Steps H between two syncs of a fragment.")
OVERLAP = typer.Option(_D.overlap, "--overlap", help="Steps tau a sync overlaps with compute (0 = blocking).")
QUORUM = typer.Option(_D.quorum, "--quorum", "-K", help="Minimum quorum K (capped at the live learners).")
GRACE = typer.Option(
    _D.grace, "--grace", help="Grace factor gamma in [0, 1); 0 disables the grace window (docs/algorithm.md: why 0.9)."
)
MERGE = typer.Option(None, "--merge", help="rda or mean. Default: rda; mean for --method diloco.")
OUTER_LR = typer.Option(_D.outer_lr, "--outer-lr", help="Outer Nesterov learning rate.")
OUTER_MOMENTUM = typer.Option(_D.outer_momentum, "--outer-momentum", help="Outer Nesterov momentum.")
