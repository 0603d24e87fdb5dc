"""The pure Decoupled DiLoCo core: no I/O, no clocks, no threads. Drivers feed it events and time."""

from .config import AlgorithmConfig
from .fragments import FragmentPlan, balanced_fragments, plan_for_model
from .learner import LearnerCore
from .merge import (
    merge_outer_gradients,
    outer_gradient,
    radial_directional_average,
    weighted_mean,
)
from .messages import (
    AdmittedWork,
    Contribution,
    Decline,
    FragmentRequest,
    FragmentUpdate,
    Merged,
    RejectCode,
    Rejected,
)
from .outer import NesterovOuterOptimizer
from .schedule import Schedule
from .synchronizer import SynchronizerCore
from .timing import Ema, GraceWindow
from .weights import token_weight

__all__ = [
    "AdmittedWork",
    "AlgorithmConfig",
    "Contribution",
    "Decline",
    "Ema",
    "FragmentPlan",
    "FragmentRequest",
    "FragmentUpdate",
    "GraceWindow",
    "LearnerCore",
    "Merged",
    "NesterovOuterOptimizer",
    "RejectCode",
    "Rejected",
    "Schedule",
    "SynchronizerCore",
    "balanced_fragments",
    "merge_outer_gradients",
    "outer_gradient",
    "plan_for_model",
    "radial_directional_average",
    "token_weight",
    "weighted_mean",
]
