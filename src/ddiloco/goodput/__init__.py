"""The chip-scale goodput simulator (`ddiloco goodput`): goodput and uptime of four training methods
under failures on up to millions of chips, with no training (the virtual-clock cluster is `ddiloco.sim`).

Modules, one idea each:
    config      every knob, with its default (reasons in docs/goodput.md)
    failures    the per-slice failure/repair process, vectorised over slices
    timeline    events -> running intervals (the sweep all accounting uses)
    progress    cumulative work as a function of time, for vectorised look-ups
    ddp, elastic, diloco, decoupled   each method's accounting
    runner, stats   seeds, common random numbers, mean and 95 % interval
    trace_export    the M-learner failure trace for `ddiloco sim` and the real launcher
    plot        goodput against chip count
"""

from .config import GoodputConfig
from .failures import SliceOutages, sample_outages
from .result import METHODS, MethodResult
from .runner import RunReport, Summary, run, simulate_seed

__all__ = [
    "GoodputConfig",
    "METHODS",
    "MethodResult",
    "RunReport",
    "SliceOutages",
    "Summary",
    "run",
    "sample_outages",
    "simulate_seed",
]
