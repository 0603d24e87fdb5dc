"""Command-line options shared by the commands that run the algorithm, defined once.

Defaults come from `AlgorithmConfig` itself, so `ddiloco sim`, `ddiloco run` and
`ddiloco synchronizer` cannot drift apart from the core or from each other.
"""

from __future__ import annotations

import copy
import enum
from typing import Any

import typer
from typer.models import OptionInfo

from ..core.config import AlgorithmConfig
from ..learner.ending import DEFAULT_ORPHAN_TIMEOUT
from ..train.inner import DEFAULT_LR, InnerConfig

_D = AlgorithmConfig()
INNER = InnerConfig()  # the inner settings' defaults, for every command's flags
DEFAULT_LR_TEXT = ", ".join(f"{lr:g} with {name}" for name, lr in DEFAULT_LR.items())  # --inner-lr's help

# The panels a command's --help groups its options in (typer's rich_help_panel); the options below name
# theirs where it is the same in every command that takes them (`in_panel` places one for one command).
RUN, ALGORITHM, NETWORK, CHAOS, BACKENDS, OUTPUT = "Run", "Algorithm", "Network", "Chaos", "Backends", "Output"


def in_panel(option: OptionInfo, panel: str) -> Any:  # Any: as typer.Option's
    """A shared option as one command shows it: in its help panel `panel` (the option itself is unchanged)."""
    placed = copy.copy(option)
    placed.rich_help_panel = panel
    return placed


LEARNERS = typer.Option(4, "--learners", "-M", min=1, max=4096, help="Number of learners M (the paper uses 8).")
FRAGMENTS = typer.Option(
    None,
    "--fragments",
    "-P",
    min=1,
    help=f"Fragments P (default {_D.fragments}, or the number of "
    "parameter tensors or H if fewer; ignored by --method diloco).",
    rich_help_panel=ALGORITHM,
)
SYNC_EVERY = typer.Option(
    _D.sync_every, "--sync-every", "-H", help="Steps H between two syncs of a fragment.", rich_help_panel=ALGORITHM
)
OVERLAP = typer.Option(
    "auto",
    "--overlap",
    help=f"Steps tau a sync overlaps with compute: auto (tau_0 = {_D.overlap} plus the steps each learner's "
    "measured link takes, at most H - 1), or a number that fixes it (0 = blocking).",
    rich_help_panel=ALGORITHM,
)
LATE = typer.Option(
    _D.late,
    "--late",
    help="Work that missed its round: merge (into the fragment's next round, counted once) or refuse "
    "(the paper's: dropped, the learner overwritten).",
    rich_help_panel=ALGORITHM,
)
MAX_STALENESS = typer.Option(
    _D.max_staleness,
    "--max-staleness",
    min=1,
    max=1000,
    help="S: late work more than this many versions behind is refused.",
    rich_help_panel=ALGORITHM,
)
STALENESS_DISCOUNT = typer.Option(
    _D.staleness_discount,
    "--staleness-discount",
    min=0.0,
    max=1e6,
    help="lambda: late work's token weight is divided by 1 + lambda * (versions it missed).",
    rich_help_panel=ALGORITHM,
)
QUORUM = typer.Option(
    _D.quorum, "--quorum", "-K", help="Minimum quorum K (capped at the live learners).", rich_help_panel=ALGORITHM
)
GRACE = typer.Option(
    _D.grace,
    "--grace",
    help="Grace factor gamma in [0, 1); 0 disables the grace window (docs/algorithm.md: why 0.9).",
    rich_help_panel=ALGORITHM,
)
MERGE = typer.Option(
    None, "--merge", help="Default: rda; mean for --method diloco and streaming.", rich_help_panel=ALGORITHM
)
OUTER_LR = typer.Option(_D.outer_lr, "--outer-lr", help="Outer Nesterov learning rate.", rich_help_panel=ALGORITHM)
OUTER_MOMENTUM = typer.Option(
    _D.outer_momentum, "--outer-momentum", help="Outer Nesterov momentum.", rich_help_panel=ALGORITHM
)
ARRIVAL = typer.Option(
    _D.arrival,
    "--arrival",
    help="When a global fragment arrives: overwrite (the paper's; the "
    "steps since the snapshot are lost), rebase (keep them: Theta + theta - theta_snapshot), or auto "
    "(rebase where rounds average several learners: a grace window or K > 1; overwrite otherwise).",
    rich_help_panel=ALGORITHM,
)
FINAL_MOMENTUM = typer.Option(
    _D.final_momentum,
    "--final-momentum/--no-final-momentum",
    help="Whether the merges of the final flush take the outer momentum (off: a plain "
    "lr * delta step, no end-of-run kick).",
    rich_help_panel=ALGORITHM,
)
MAX_OUTER_NORM_RATIO = typer.Option(
    _D.max_outer_norm_ratio,
    "--max-outer-norm-ratio",
    min=0.0,
    max=1e12,
    help="Refuse a contribution whose outer gradient's norm exceeds this multiple of its fragment's (0: off).",
    rich_help_panel=ALGORITHM,
)
EMA = typer.Option(
    _D.ema,
    "--ema",
    min=0.0,
    max=1.0,
    help="Smoothing alpha in (0, 1] of the step and sync times the grace window is sized from (the "
    "learners smooth their step time with it too).",
    rich_help_panel=ALGORITHM,
)
OUTER_DEBIAS = typer.Option(
    _D.outer_debias,
    "--outer-debias/--no-outer-debias",
    help="Correct the outer momentum's early-step bias: its term is scaled by 1 / (1 - mu^t) at the "
    "fragment's t-th outer step, so the first steps move as far as later ones (off until measured).",
    rich_help_panel=ALGORITHM,
)
OUTER_RESTART_EVERY = typer.Option(
    _D.outer_restart_every,
    "--outer-restart-every",
    min=0,
    max=10**6,
    help="R: zero a fragment's outer momentum before its every R-th outer step (0: never; off until measured).",
    rich_help_panel=ALGORITHM,
)
OUTER_LR_PER_LEARNER = typer.Option(
    _D.outer_lr_per_learner,
    "--outer-lr-per-learner",
    min=0.0,
    max=1e6,
    help="k: a merge of M contributions steps with outer lr * (1 + k (M - 1)) (0: the same lr for any M; "
    "off until measured).",
    rich_help_panel=ALGORITHM,
)
STALE_CORRECTION = typer.Option(
    _D.stale_correction,
    "--stale-correction/--no-stale-correction",
    help="HeLoCo's stale-work correction: late work merged into a later round loses, per tensor, part of "
    "its component opposing the fragment's outer momentum (fresh work untouched; off until measured).",
    rich_help_panel=ALGORITHM,
)

#: The `AlgorithmConfig` fields that are flags of the same name, taken as given (`algorithm_knobs`).
PLAIN_KNOBS = (
    "sync_every",
    "quorum",
    "grace",
    "outer_lr",
    "outer_momentum",
    "arrival",
    "final_momentum",
    "late",
    "max_staleness",
    "staleness_discount",
    "ema",
    "max_outer_norm_ratio",
    "outer_debias",
    "outer_restart_every",
    "outer_lr_per_learner",
    "stale_correction",
)


def algorithm_knobs(flags: Any) -> dict[str, Any]:
    """The `AlgorithmConfig` fields a command's algorithm flags give: `PLAIN_KNOBS` as they are, and
    overlap and overlap_auto from --overlap (`parse_overlap`). Fragments, merge and synchronous are
    each command's (the model's tensors, the method's)."""
    overlap, overlap_auto = parse_overlap(flags.overlap)
    knobs = {name: plain(getattr(flags, name))[0] for name in PLAIN_KNOBS}
    return {**knobs, "overlap": overlap, "overlap_auto": overlap_auto}


class Codec(str, enum.Enum):
    """Outer-gradient codecs (docs/runtime.md); values are the wire names."""

    bf16 = "bf16"
    int8 = "int8"
    int4 = "int4"
    fp32 = "fp32"


class CodecDown(str, enum.Enum):
    """Codecs of the global fragments sent to learners: whole (fp32, bf16), or as quantised
    differences from the version a learner holds (int8, int4; `synchronizer.downlink`)."""

    fp32 = "fp32"
    bf16 = "bf16"
    int8 = "int8"
    int4 = "int4"


class AllreducePrecision(str, enum.Enum):  # ddiloco run --method ddp|elastic-ddp --allreduce-precision
    bf16 = "bf16"
    fp32 = "fp32"


CODEC = typer.Option(Codec.bf16, help="Outer-gradient codec.", rich_help_panel=NETWORK)
NET_LATENCY = typer.Option(
    0.0,
    min=0.0,
    max=1e6,
    help="Emulated wide-area link: one-way latency per message, milliseconds.",
    rich_help_panel=NETWORK,
)
NET_BANDWIDTH = typer.Option(
    0.0,
    min=0.0,
    max=1e6,
    help="Emulated wide-area link: megabytes per second each way for tensors (control messages are exempt); 0: no cap.",
    rich_help_panel=NETWORK,
)
NET_JITTER = typer.Option(
    0.0,
    min=0.0,
    max=1e6,
    help="Emulated wide-area link: a uniform 0..J milliseconds added to each message's latency.",
    rich_help_panel=NETWORK,
)


# str enums whose values are the choices, so that --help lists them and typos end in exit code 2.
# (Classes rather than enum.Enum(name, values): a type checker can read them as types.)


class Model(str, enum.Enum):  # train.tasks.MODELS (a test keeps them equal)
    gpt = "gpt"
    gpt_moe = "gpt-moe"
    vision = "vision"


class ModelSize(str, enum.Enum):  # train.tasks.MODEL_SIZES
    default = "default"
    tiny = "tiny"
    m2 = "2m"
    m10 = "10m"
    m50 = "50m"


class Tokenizer(str, enum.Enum):
    byte = "byte"
    bpe = "bpe"


class Merge(str, enum.Enum):
    rda = "rda"
    mean = "mean"


class SimMethod(str, enum.Enum):  # core.methods.METHODS
    decoupled = "decoupled"
    diloco = "diloco"
    ddp = "ddp"
    elastic_ddp = "elastic-ddp"
    streaming = "streaming"


class RuntimeMethod(str, enum.Enum):  # core.methods.DILOCO_METHODS
    decoupled = "decoupled"
    diloco = "diloco"
    streaming = "streaming"


class RunMethod(str, enum.Enum):  # ddiloco run: the runtime's methods and the data-parallel baselines
    decoupled = "decoupled"
    diloco = "diloco"
    ddp = "ddp"
    elastic_ddp = "elastic-ddp"
    streaming = "streaming"


class Network(str, enum.Enum):  # ddiloco run --network
    loopback = "loopback"
    hosts = "hosts"


class Backend(str, enum.Enum):
    local = "local"
    slurm = "slurm"
    skypilot = "skypilot"


class LearnerState(str, enum.Enum):  # cluster.sbatch.LEARNER_STATES
    shared = "shared"
    scratch = "scratch"


class Precision(str, enum.Enum):  # train.device.PRECISIONS
    fp32 = "fp32"
    bf16 = "bf16"


class BudgetCounts(str, enum.Enum):  # synchronizer.settings.BUDGET_COUNTS
    trained = "trained"
    merged = "merged"


class Arrival(str, enum.Enum):  # core.config.ArrivalMode
    auto = "auto"
    overwrite = "overwrite"
    rebase = "rebase"


class Late(str, enum.Enum):  # core.config.LateMode
    merge = "merge"
    refuse = "refuse"


class InnerOptimizer(str, enum.Enum):  # train.inner.INNER_OPTIMIZERS
    adamw = "adamw"
    muon = "muon"


# The inner optimizer's options (`train.inner.InnerConfig`; docs/algorithm.md, "Inner-optimizer options"):
# the same flags in `ddiloco sim`, `ddiloco run` (its Run panel, beside --inner-lr) and `ddiloco learner`.
INNER_OPTIMIZER = typer.Option(
    INNER.optimizer,
    "--inner-optimizer",
    help="muon: Muon on the hidden weight matrices, AdamW on embeddings, head and the rest (MuLoCo; the "
    "default since 0.4, measured: docs/results.md); adamw: AdamW on every parameter.",
)
SLOW_MOMENTUM = typer.Option(
    INNER.slow_momentum,
    "--slow-momentum",
    min=0.0,
    max=0.999999,
    help="MT-DAO: beta of a slow inner momentum mixed into AdamW's step beside its fast one, e.g. 0.99 "
    "(with --inner-optimizer adamw; 0: off, the default until measured).",
)
SLOW_WEIGHT = typer.Option(
    INNER.slow_weight,
    "--slow-weight",
    min=0.0,
    max=1.0,
    help="MT-DAO: the slow momentum's share of AdamW's step, the fast one's the rest (with --slow-momentum).",
)
REWARM_STEPS = typer.Option(
    INNER.rewarm_steps,
    "--rewarm-steps",
    min=0,
    max=10**6,
    help="After a learner adopts a global fragment, warm its inner lr up again linearly over this many "
    "steps (0: off, the default until measured).",
)


def inner_config(flags: Any) -> InnerConfig:
    """The `InnerConfig` a command's inner-optimizer flags give (--inner-lr, --batch-size and the options
    above): one place for `sim`, `run` and `learner`."""
    return InnerConfig(
        lr=flags.inner_lr,  # None: the optimizer's default (train.inner.DEFAULT_LR)
        batch_size=flags.batch_size,
        optimizer=plain(flags.inner_optimizer)[0],
        slow_momentum=flags.slow_momentum,
        slow_weight=flags.slow_weight,
        rewarm_steps=flags.rewarm_steps,
    )


def parse_overlap(value: str | int) -> tuple[int, bool]:
    """`--overlap`: "auto" -> (tau_0, True); a number n -> (n, False)."""
    text = str(value).strip().lower()
    if text == "auto":
        return _D.overlap, True
    try:
        return int(text), False
    except ValueError:
        raise typer.BadParameter(f"--overlap takes 'auto' or a number of steps, got {value!r}") from None


def plain(*values: object) -> tuple:
    """Enum choices as the plain strings the rest of the code takes."""
    return tuple(v.value if isinstance(v, enum.Enum) else v for v in values)


HEARTBEAT = typer.Option(
    0.5,
    min=0.01,
    max=3600.0,
    help="Heartbeat interval h in seconds; the other timeouts derive from it (docs/runtime.md).",
    rich_help_panel=NETWORK,
)
MIN_BANDWIDTH = typer.Option(
    None,
    min=0.001,
    max=1e6,
    help="The slowest link a push or fetch may travel, MB/s: a bulk stream's deadline is rpc + bytes / this "
    "+ the failure timeout (default 10; ddiloco run --net-bandwidth B takes B / 2).",
    rich_help_panel=NETWORK,
)
ORPHAN_TIMEOUT = typer.Option(
    DEFAULT_ORPHAN_TIMEOUT,
    min=0.1,
    max=1e6,
    help="Seconds a learner goes on without an answer from its synchronizer before it ends (exit code 3, its "
    "journal and inner state kept); after S x H steps alone (--max-staleness rounds) it only waits, untrained.",
    rich_help_panel=NETWORK,
)
# The bounds of a run's budget, in tokens and in seconds.
TOKENS_MIN, TOKENS_MAX = 1, 2**53
DURATION_MIN, DURATION_MAX = 0.001, 1e7


class WandbMode(str, enum.Enum):
    offline = "offline"
    online = "online"


TENSORBOARD = typer.Option(
    None,
    "--tensorboard",
    help="Also write the metrics (eval and training loss, goodput) as "
    "TensorBoard events in this folder (pip install tensorboard).",
    rich_help_panel=OUTPUT,
)
WANDB = typer.Option(
    False,
    "--wandb",
    help="Also log the metrics to Weights & Biases (pip install wandb), in the run directory's wandb/ folder.",
    rich_help_panel=OUTPUT,
)
WANDB_MODE = typer.Option(
    WandbMode.offline,
    "--wandb-mode",
    help="offline needs no network or account (upload later with `wandb sync`).",
    rich_help_panel=OUTPUT,
)
WANDB_PROJECT = typer.Option("ddiloco", "--wandb-project", help="wandb project name.", rich_help_panel=OUTPUT)
DASHBOARD_HOST = typer.Option(
    "127.0.0.1",
    "--dashboard-host",
    help="Dashboard address; beyond loopback it needs --token (the page is read with a view credential from it).",
    rich_help_panel=OUTPUT,
)
DASHBOARD_PORT = typer.Option(
    0, "--dashboard-port", min=0, max=65535, help="Dashboard port (0: a free one).", rich_help_panel=OUTPUT
)

THREADS = typer.Option(
    0,
    "--threads",
    min=0,
    max=1024,
    help="torch threads per process (0: automatic: PyTorch's "
    "default for one process; `ddiloco run` shares the cores among its processes).",
)


class LogLevel(str, enum.Enum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


LOG_LEVEL = typer.Option(
    "info", "--log-level", help="Log records at this level and above go to stderr.", rich_help_panel=OUTPUT
)


def set_threads(threads: int) -> None:
    """--threads N: N torch threads; 0 leaves PyTorch's default."""
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


def shared_threads(threads: int, processes: int) -> int:
    """--threads for each of `processes` processes on this machine: N as given, 0 shares the cores."""
    import os

    return threads if threads > 0 else max(1, (os.cpu_count() or 1) // max(1, processes))


DATA = typer.Option(
    None,
    "--data",
    help="Text file or folder (LMs) or torchvision root (vision). Default: the "
    "Python standard library's own source (LMs) or scikit-learn's digits (vision); nothing is downloaded.",
)
SEQ_LEN = typer.Option(128, "--seq-len", min=1, max=1 << 20, help="Context length of the language models.")


class ShardLayout(str, enum.Enum):  # train.streams.SHARD_LAYOUTS
    interleaved = "interleaved"
    contiguous = "contiguous"


SHARD_LAYOUT = typer.Option(
    ShardLayout.interleaved,
    "--shard-layout",
    help="How a text is dealt to the learners: interleaved (blocks of 4,096 tokens in turn, so every shard "
    "spans the whole text; the default since 0.4) or contiguous (one chunk each, as before 0.4).",
)
