"""Every knob of the goodput simulator, with its default and the reason for it.

The defaults are chosen once, from physical reasoning, and then checked against the paper's
calibration table (MTBI 1 year, 1.2 million chips); docs/goodput.md explains each one. All times
are in seconds inside the simulator; the CLI takes the units a person thinks in (years, hours, days).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

SECONDS_PER_YEAR = 365.0 * 86400.0
SECONDS_PER_DAY = 86400.0
SECONDS_PER_HOUR = 3600.0

REPAIR_DISTRIBUTIONS = ("lognormal", "exponential", "fixed")


@dataclass(frozen=True)
class GoodputConfig:
    """The cluster, its failures and the recovery costs of every method.

    Attributes (defaults in brackets, reasons in docs/goodput.md):
        mtbi_years: mean time between interruptions of one chip [1.0, the paper's value].
        slice_chips: chips per slice, the unit that fails and is repaired together [256].
        repair_dist: distribution of a failed slice's down time [lognormal].
        repair_mean_hours: mean down time of a failed slice [0.75].
        repair_sigma: shape (sigma of log) of the lognormal repair time [1.0].
        detect_s: time until a failure is detected (heartbeat timeout) [5].
        reconfig_s: elastic pause to drop a failed slice and go on with the live ones [10].
        scaleup_s: elastic pause to take a repaired slice back in [3].
        restart_s: non-elastic data-parallel restart on a spare slice, after detection [60].
        checkpoint_s: non-elastic data-parallel (in-memory) checkpoint interval [5].
        step_s: time of one training step; a failure loses the step in flight [2].
        step_cv: coefficient of variation of one learner's step time [0.05].
        inner_steps: H, inner steps between two syncs of a fragment / outer steps [24].
        overlap_steps: tau, steps a fragment sync overlaps with compute [2].
        quorum: K, learners the synchronizer needs before it merges [1].
        rejoin_s: extra pause of a DiLoCo learner after a failure, to rejoin the synchronizer [2].
        outer_sync_s: blocking outer all-reduce of synchronous DiLoCo [0, bandwidth out of scope].
        days: simulated wall-clock horizon [7].
    """

    mtbi_years: float = 1.0
    slice_chips: int = 256
    repair_dist: str = "lognormal"
    repair_mean_hours: float = 0.75
    repair_sigma: float = 1.0
    detect_s: float = 5.0
    reconfig_s: float = 10.0
    scaleup_s: float = 3.0
    restart_s: float = 60.0
    checkpoint_s: float = 5.0
    step_s: float = 2.0
    step_cv: float = 0.05
    inner_steps: int = 24
    overlap_steps: int = 2
    quorum: int = 1
    rejoin_s: float = 2.0
    outer_sync_s: float = 0.0
    days: float = 7.0

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every invalid setting, in words (empty when the config is valid)."""
        out: list[str] = []

        def positive(name: str) -> None:
            if not getattr(self, name) > 0:
                out.append(f"{name} must be > 0, got {getattr(self, name)}")

        def non_negative(name: str) -> None:
            if not getattr(self, name) >= 0:
                out.append(f"{name} must be >= 0, got {getattr(self, name)}")

        for name in ("mtbi_years", "repair_mean_hours", "step_s", "checkpoint_s", "days"):
            positive(name)
        for name in ("detect_s", "reconfig_s", "scaleup_s", "restart_s", "rejoin_s", "step_cv", "outer_sync_s"):
            non_negative(name)
        if self.slice_chips < 1:
            out.append(f"slice_chips must be >= 1, got {self.slice_chips}")
        if self.repair_dist not in REPAIR_DISTRIBUTIONS:
            out.append(f"repair_dist must be one of {', '.join(REPAIR_DISTRIBUTIONS)}, got {self.repair_dist!r}")
        if self.repair_dist == "lognormal" and not self.repair_sigma > 0:
            out.append(f"repair_sigma must be > 0 for a lognormal repair time, got {self.repair_sigma}")
        if self.inner_steps < 1:
            out.append(f"inner_steps (H) must be >= 1, got {self.inner_steps}")
        if self.overlap_steps < 0:
            out.append(f"overlap_steps (tau) must be >= 0, got {self.overlap_steps}")
        elif self.overlap_steps >= self.inner_steps >= 1:
            out.append(
                f"overlap_steps (tau = {self.overlap_steps}) must be below inner_steps (H = {self.inner_steps}): "
                "a sync cannot overlap more steps than lie between two syncs"
            )
        if self.quorum < 1:
            out.append(f"quorum (K) must be >= 1, got {self.quorum}")
        return out

    # Derived quantities, in seconds.
    @property
    def mtbi_s(self) -> float:
        return self.mtbi_years * SECONDS_PER_YEAR

    @property
    def horizon_s(self) -> float:
        return self.days * SECONDS_PER_DAY

    @property
    def repair_mean_s(self) -> float:
        return self.repair_mean_hours * SECONDS_PER_HOUR

    @property
    def repair_share(self) -> float:
        """Long-run share of slices under repair: a slice alternates MTBI/slice_chips up and a mean repair down."""
        return self.repair_mean_s / (self.mtbi_s / self.slice_chips + self.repair_mean_s)

    @property
    def slack_s(self) -> float:
        """How long a learner may run ahead of a sync that cannot form before it must wait."""
        return self.overlap_steps * self.step_s

    def with_(self, **changes: object) -> GoodputConfig:
        return replace(self, **changes)  # type: ignore[arg-type]  # dataclasses.replace checks the names and types

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
