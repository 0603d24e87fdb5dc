"""`ddiloco sim`: one configuration on the virtual clock, with a progress bar and a summary."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from ..chaos.trace import FailureTrace, random_trace
from ..core import methods
from ..core.config import AlgorithmConfig, MergeMode
from ..records.events import EventLog
from ..records.rundir import MetricsLog, RunDir, jsonable
from ..sim.config import SimConfig
from ..sim.hardware import LinkModel, StepTimeModel, half_slow
from ..sim.recorder import SimRecorder
from . import app, options
from ._flags import takes
from .output import metric_sinks, print_summary, progress_bar, user_error

if TYPE_CHECKING:
    from ..train.tasks import Task


def parse_speeds(text: str | None, learners: int, hetero: float | None) -> tuple[float, ...]:
    """--speeds 1,1,1.2,1.2 (per learner) or --hetero 1.2 (the second half that much slower)."""
    if text and hetero:
        raise typer.BadParameter("give either --speeds or --hetero, not both")
    if hetero:
        if hetero < 1:
            raise typer.BadParameter(f"--hetero is a slowdown factor >= 1, got {hetero}")
        return half_slow(learners, hetero)
    if not text:
        return ()
    try:
        speeds = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"--speeds must be comma-separated numbers, got {text!r}") from None
    if len(speeds) != learners:
        raise typer.BadParameter(f"--speeds gives {len(speeds)} factors for {learners} learners")
    return speeds


def failure_trace(
    path: Path | None, mtbf: float | None, downtime: float, scale: float, learners: int, horizon: float, seed: int
) -> FailureTrace:
    if path is not None and mtbf is not None:
        raise typer.BadParameter("give either --chaos-trace FILE or --learner-mtbf, not both")
    if path is not None:
        try:
            return FailureTrace.load(path).scaled(scale).for_learners(learners)
        except (OSError, ValueError) as exc:
            raise user_error(exc) from None
    if mtbf is not None:
        if mtbf <= 0 or downtime <= 0:
            raise typer.BadParameter("--learner-mtbf and --learner-down must be > 0")
        return random_trace(learners, horizon, mtbf, downtime, seed=seed + 1)
    return FailureTrace()


@dataclass(frozen=True)
class SimFlags:
    """The flags of `ddiloco sim`: one field per flag (`_flags.takes`)."""

    method: options.SimMethod = typer.Option("decoupled", help="Decoupled DiLoCo or one of its baselines.")
    model: options.Model = typer.Option(
        "gpt", help="gpt (dense transformer LM), gpt-moe (mixture of experts) or vision."
    )
    model_size: options.ModelSize = typer.Option("default", help="default (~1M parameters) or tiny (quick checks).")
    data: str | None = options.DATA
    seq_len: int = options.SEQ_LEN
    shard_layout: options.ShardLayout = options.SHARD_LAYOUT
    tokenizer: options.Tokenizer = typer.Option(
        "byte", help="byte (256 symbols) or bpe (trained here on the training text)."
    )
    bpe_vocab: int = typer.Option(1024, help="Vocabulary size of the BPE tokenizer.")
    learners: int = options.LEARNERS
    fragments: int | None = options.FRAGMENTS
    sync_every: int = options.SYNC_EVERY
    overlap: str = options.OVERLAP
    quorum: int = options.QUORUM
    grace: float = options.GRACE
    merge: options.Merge | None = options.MERGE
    outer_lr: float = options.OUTER_LR
    outer_momentum: float = options.OUTER_MOMENTUM
    arrival: options.Arrival = options.ARRIVAL
    final_momentum: bool = options.FINAL_MOMENTUM
    late: options.Late = options.LATE
    max_staleness: int = options.MAX_STALENESS
    staleness_discount: float = options.STALENESS_DISCOUNT
    ema: float = options.EMA
    max_outer_norm_ratio: float = options.MAX_OUTER_NORM_RATIO
    outer_debias: bool = options.OUTER_DEBIAS
    outer_restart_every: int = options.OUTER_RESTART_EVERY
    outer_lr_per_learner: float = options.OUTER_LR_PER_LEARNER
    stale_correction: bool = options.STALE_CORRECTION
    inner_lr: float | None = typer.Option(
        None,
        min=0.0,
        help=f"Inner learning rate (peak; cosine decay over the run; default: {options.DEFAULT_LR_TEXT}).",
    )
    batch_size: int = typer.Option(options.INNER.batch_size, help="Sequences (or images) per learner step.")
    inner_optimizer: options.InnerOptimizer = options.INNER_OPTIMIZER
    slow_momentum: float = options.SLOW_MOMENTUM
    slow_weight: float = options.SLOW_WEIGHT
    rewarm_steps: int = options.REWARM_STEPS
    tokens: int = typer.Option(
        400_000, help="Token budget: training stops when the learners have trained on this many."
    )
    seed: int = typer.Option(0, help="Seed: the run is deterministic from it.")
    step_time: float = typer.Option(1.0, help="Simulated seconds per step of a learner of speed 1.")
    speeds: str | None = typer.Option(None, help="Per-learner slowdown factors, e.g. 1,1,1.2,1.2.")
    hetero: float | None = typer.Option(None, help="Make the second half of the learners this much slower.")
    jitter: float = typer.Option(0.0, help="Uniform step-time jitter, e.g. 0.1 for +-10 %.")
    straggle_prob: float = typer.Option(0.0, help="Chance that a step straggles.")
    straggle_factor: float = typer.Option(3.0, help="How much slower a straggling step is.")
    failures: Path | None = typer.Option(
        None, "--chaos-trace", help="Failure trace CSV (learner,down_at,up_at) to replay."
    )
    failures_scale: float = typer.Option(
        1.0, "--chaos-trace-scale", help="Multiply the trace's times by this (trace seconds to sim seconds)."
    )
    fail_mtbf: float | None = typer.Option(
        None, "--learner-mtbf", help="Random failures: mean simulated seconds between a learner's failures."
    )
    fail_downtime: float = typer.Option(
        15.0, "--learner-down", help="Random failures: mean simulated seconds a failed learner stays down."
    )
    net_latency: float = typer.Option(
        10.0, min=0.0, help="One-way message latency, milliseconds (of simulated time), as ddiloco run's."
    )
    net_bandwidth: float = typer.Option(
        1000.0, min=0.0, help="Link bandwidth, MB per simulated second, as ddiloco run's (0: no cap)."
    )
    codec: options.Codec | None = typer.Option(
        None,
        "--codec",
        help="Send outer gradients through this wire "
        "codec (values and bytes, as the runtime does). Default: exact, "
        "as the quality benchmarks run.",
    )
    reconfigure_seconds: float = typer.Option(5.0, help="elastic-ddp: pause on every membership change.")
    eval_batches: int = typer.Option(
        20, help="Validation batches of every evaluation, along the way and final (one yardstick)."
    )
    threads: int = options.THREADS
    events: Path | None = typer.Option(
        None,
        "--event-log",
        help="Write the run's events (failures, joins, merges with who was admitted, rejections) as JSON lines.",
    )
    tensorboard: Path | None = options.TENSORBOARD
    wandb: bool = options.WANDB
    wandb_mode: options.WandbMode = options.WANDB_MODE
    wandb_project: str = options.WANDB_PROJECT
    run_dir: Path | None = typer.Option(
        None,
        help="Keep the whole run here: config.json, summary.json, metrics.jsonl (eval loss, training loss, "
        "goodput over tokens and time), events.jsonl. `ddiloco report DIR` plots it.",
    )
    as_json: bool = typer.Option(False, "--json", help="End with one line of JSON holding the summary.")
    quiet: bool = typer.Option(False, help="No progress bar.")


def _algorithm(flags: SimFlags, method: str, fragments: int) -> AlgorithmConfig:
    """The algorithm's knobs as the flags give them (`options.algorithm_knobs`; --overlap auto is tau_0
    here: the virtual clock has no measured link), then what the method sets, whatever was asked."""
    merge = options.plain(flags.merge)[0]
    knobs = dict(
        options.algorithm_knobs(flags),
        fragments=fragments,
        merge=cast(MergeMode, merge or methods.default_merge(method)),  # an options.Merge value
    )
    return AlgorithmConfig(**{**knobs, **methods.fixed_knobs(method, flags.learners)})


def _sim_config(flags: SimFlags) -> tuple[SimConfig, Task]:
    """The configuration the flags ask for, and its task (built first when it tells the default number
    of fragments); a bad value ends as the command line's error."""
    from ..sim.run import build_task

    method, model, model_size, tokenizer = options.plain(flags.method, flags.model, flags.model_size, flags.tokenizer)
    probe = None  # the task, when building it first tells the default number of fragments
    fragments = flags.fragments
    try:
        fixed = methods.fixed_knobs(method, flags.learners)  # what the method sets, whatever was asked (core.methods)
        if fragments is None and "fragments" not in fixed:
            from ..api.model import fit_fragments
            from ..train.tasks import make_task

            probe = make_task(
                model,
                flags.data,
                seq_len=flags.seq_len,
                model_size=model_size,
                tokenizer=tokenizer,
                bpe_vocab_size=flags.bpe_vocab,
            )
            fragments = fit_fragments(len(list(probe.build_model(flags.seed).parameters())), None, flags.sync_every)
        algorithm = _algorithm(flags, method, fragments or 1)
        if flags.rewarm_steps and method not in methods.DILOCO_METHODS:
            raise ValueError(f"--method {method}: --rewarm-steps follows adoptions of a global model; there are none")
        speeds = parse_speeds(flags.speeds, flags.learners, flags.hetero)
        steps = StepTimeModel(flags.step_time, speeds, flags.jitter, flags.straggle_prob, flags.straggle_factor)
        # A generous horizon for random failures: the run cannot take longer than this at speed 1.
        horizon = (
            4.0
            * flags.step_time
            * max(steps.speeds or (1.0,))
            * flags.tokens
            / max(1, flags.batch_size * flags.seq_len)
        )
        config = SimConfig(
            method=method,
            model=model,
            model_size=model_size,
            data=flags.data,
            seq_len=flags.seq_len,
            shard_layout=options.ShardLayout(flags.shard_layout).value,
            tokenizer=tokenizer,
            bpe_vocab_size=flags.bpe_vocab,
            learners=flags.learners,
            tokens=flags.tokens,
            seed=flags.seed,
            algorithm=algorithm
            if method in methods.DILOCO_METHODS
            else AlgorithmConfig(fragments=1, sync_every=max(2, flags.sync_every)),
            inner=options.inner_config(flags),
            steps=steps,
            link=LinkModel(flags.net_latency / 1000.0, flags.net_bandwidth * 1e6 or math.inf),
            failures=failure_trace(
                flags.failures,
                flags.fail_mtbf,
                flags.fail_downtime,
                flags.failures_scale,
                flags.learners,
                horizon,
                flags.seed,
            ),
            reconfigure_seconds=flags.reconfigure_seconds,
            eval_batches=flags.eval_batches,
            codec=options.plain(flags.codec)[0],
        )
        return config, probe if probe is not None else build_task(config)
    except (ValueError, FileNotFoundError, NotADirectoryError) as exc:
        raise user_error(exc) from None


@app.command("sim")
@takes(SimFlags)
def sim(flags: SimFlags) -> None:
    """Train one configuration on the virtual clock: real models and data, simulated time and faults."""
    from ..sim.run import run_sim

    options.set_threads(flags.threads)
    config, task = _sim_config(flags)
    record, events = None, flags.events
    try:
        if flags.run_dir is not None:
            record = RunDir(flags.run_dir)
            record.write_config("sim", config, clock_origin=0.0)
            events = events or record.events_path
    except ValueError as exc:
        raise user_error(exc) from None
    sinks = metric_sinks(
        flags.tensorboard,
        flags.wandb,
        flags.wandb_mode,
        flags.wandb_project,
        flags.run_dir or Path.cwd(),
        flags.run_dir.name if flags.run_dir else None,
        jsonable(config),
    )
    metrics = record.metrics(sinks) if record is not None else (MetricsLog(None, sinks) if sinks else None)
    method = config.method
    with (
        EventLog(events, append=False) as log,
        progress_bar(f"{method} x{flags.learners}", disabled=flags.quiet) as update,
    ):
        progress = (
            update
            if metrics is None
            else SimRecorder(metrics, task, config.tokens, eval_batches=config.eval_batches, forward=update)
        )
        result = run_sim(config, task=task, progress=progress, observer=log.observe)
    if metrics is not None:
        metrics.close()
    if record is not None:
        record.write_summary(result)
    print_summary(result, title=f"ddiloco sim --method {method}")
    if flags.as_json:
        print(json.dumps(result, sort_keys=True))
