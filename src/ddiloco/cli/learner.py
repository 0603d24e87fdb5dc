"""`ddiloco learner`: train one of the built-in models as a learner of a running synchronizer."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from . import app, options
from ._flags import takes
from .output import user_error

if TYPE_CHECKING:
    from ..learner.trainer import LearnerSettings


@dataclass(frozen=True)
class LearnerFlags:
    """The flags of `ddiloco learner`: one field per flag (`_flags.takes`)."""

    connect: str = typer.Option(
        "127.0.0.1:7070",
        help="Synchronizer address(es), comma-separated, one per shard; "
        "@FILE reads a shard's --address-file, again whenever the shard stops answering.",
    )
    learner_id: int = typer.Option(..., "--id", min=0, help="This learner's id (0..M-1).")
    learners: int = typer.Option(4, "--learners", "-M", min=1, help="Learners M: the data is split into M shards.")
    model: options.Model = typer.Option("gpt", help="Must match the synchronizer's.")
    model_size: options.ModelSize = typer.Option("default", help="Must match the synchronizer's.")
    data: str | None = options.DATA
    seq_len: int = options.SEQ_LEN
    shard_layout: options.ShardLayout = options.SHARD_LAYOUT
    seed: int = typer.Option(0, help="Seed of the data order (the model comes from the synchronizer).")
    batch_size: int = typer.Option(options.INNER.batch_size, min=1, help="Sequences (or images) per step and rank.")
    inner_lr: float | None = typer.Option(
        None, min=0.0, help=f"Peak inner learning rate (default: {options.DEFAULT_LR_TEXT})."
    )
    inner_optimizer: options.InnerOptimizer = options.INNER_OPTIMIZER
    slow_momentum: float = options.SLOW_MOMENTUM
    slow_weight: float = options.SLOW_WEIGHT
    rewarm_steps: int = options.REWARM_STEPS
    codec: options.Codec = options.CODEC
    token: str | None = typer.Option(None, help="Shared secret (or $DDILOCO_TOKEN).")
    tls_ca: Path | None = typer.Option(None, help="CA certificate to verify a TLS synchronizer.")
    state_dir: Path | None = typer.Option(
        None, help="Folder for this learner's own state (inner optimizer, journal of trained tokens)."
    )
    net_delay: float = typer.Option(0.0, min=0.0, help="Added latency per message, milliseconds (chaos testing).")
    net_latency: float = options.NET_LATENCY
    net_bandwidth: float = options.NET_BANDWIDTH
    net_jitter: float = options.NET_JITTER
    max_steps: int | None = typer.Option(None, min=1, help="Stop after this many steps even if the run goes on.")
    save_state_every: int = typer.Option(
        24, min=1, help="Steps between saves of the inner optimizer state to --state-dir."
    )
    min_step_seconds: float = typer.Option(
        0.0,
        min=0.0,
        help="Pad every step to at least this long (emulates a learner "
        "with its own accelerator of that speed on a shared CPU).",
    )
    connect_timeout: float = typer.Option(
        120.0,
        min=0.1,
        max=1e6,
        help="Give up (exit code 2) when no synchronizer answers within this many seconds at start.",
    )
    orphan_timeout: float = options.ORPHAN_TIMEOUT
    device: str = typer.Option(
        "auto",
        "--device",
        help="Where to train: auto (cuda:LOCAL_RANK when CUDA is present, else cpu), cpu, cuda or cuda:N.",
    )
    precision: options.Precision = typer.Option(
        "fp32",
        "--precision",
        help="fp32, or bf16 through autocast (weights, optimizer state and what is sent stay fp32).",
    )
    term_grace: float = typer.Option(
        20.0,
        min=0.1,
        max=86400.0,
        help="After SIGTERM (a preemption notice): send the "
        "work held and exit within this many seconds (keep it below the scheduler's "
        "kill wait, 30 s in Slurm by default).",
    )
    peer_recovery: bool = typer.Option(
        True,
        help="Start with a live learner's inner optimizer state when this "
        "one has none of its own (a new machine); donate ours to learners that join empty.",
    )
    inner_state_dir: Path | None = typer.Option(
        None,
        help="Where the inner optimizer state is saved and loaded "
        "(default STATE_DIR/inner; node-local scratch works too).",
    )
    threads: int = options.THREADS
    as_json: bool = typer.Option(False, "--json", help="End with one JSON line of this learner's stats.")
    log_level: options.LogLevel = options.LOG_LEVEL


@app.command("learner")
@takes(LearnerFlags)
def learner(flags: LearnerFlags) -> None:
    """Train until the synchronizer says the run is over; communication never blocks the training loop.

    Exit codes: 0 the run ended (or this learner's work is all counted), 2 no synchronizer at start or
    a refusal, 3 ended without its synchronizer (no answer for --orphan-timeout seconds, or the run
    finished with its last work unmerged; its journal and inner state are kept)."""

    from ..learner.link import SynchronizerError
    from ..learner.trainer import leave_process_group, train
    from ..records import logsetup

    logsetup.configure(f"learner{flags.learner_id}", options.plain(flags.log_level)[0])
    options.set_threads(flags.threads)
    try:
        settings = learner_settings(flags)
    except (ValueError, OSError) as exc:
        raise user_error(exc) from None
    try:
        stats = train(settings)
    except (SynchronizerError, ConnectionError) as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    if flags.as_json:  # one write per line: the ranks of a torchrun group share this file
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), (json.dumps(stats) + "\n").encode())
    code = int(stats.get("exit_code") or 0)
    if stats.get("ended") and stats.get("rank", 0) == 0:  # one line, why it stopped on its own
        typer.echo(("error: " if code else "") + str(stats["ended"]), err=True)
    if leave_process_group():
        # A rank of a torchrun group has still been aborted by the C++ runtime while its interpreter
        # finalized, after the group was destroyed (SIGABRT, "terminate called without an active
        # exception": gloo's threads may still hold work that refers to Python objects, pytorch#179291),
        # and torchrun then restarts the group of a run that is over. Everything is written by now.
        logsetup.exit_now(code)
    if code:  # 3 (`ending.EXIT_ORPHANED`): ended without its synchronizer; a scheduler must not restart it
        sys.exit(code)


def learner_settings(flags: LearnerFlags) -> LearnerSettings:
    """The learner's settings from its flags (or its `--config` file), each checked: a bad one raises
    ValueError naming the flag."""
    from ..learner.addresses import check_spec
    from ..learner.trainer import LearnerSettings
    from ..learner.wan import LinkConfig
    from ..train.device import resolve_device, step_slowdown
    from ..wire import auth

    model, model_size = options.plain(flags.model, flags.model_size)
    settings = LearnerSettings(
        learner=flags.learner_id,
        addresses=flags.connect,
        learners=flags.learners,
        model=model,
        model_size=model_size,
        data=flags.data,
        seq_len=flags.seq_len,
        shard_layout=options.ShardLayout(flags.shard_layout).value,
        seed=flags.seed,
        inner=options.inner_config(flags),
        codec=options.Codec(flags.codec).value,
        token=auth.resolve_token(flags.token),
        credentials=auth.channel_credentials(flags.tls_ca),
        state_dir=str(flags.state_dir) if flags.state_dir else None,
        net_delay=flags.net_delay / 1000.0,
        max_steps=flags.max_steps,
        wan=LinkConfig(flags.net_latency, flags.net_bandwidth, flags.net_jitter),
        checkpoint_every=flags.save_state_every,
        min_step_seconds=flags.min_step_seconds * step_slowdown(flags.learner_id),  # mixed hardware, emulated
        start_timeout=flags.connect_timeout,
        orphan_timeout=flags.orphan_timeout,
        device=flags.device,
        precision=options.plain(flags.precision)[0],
        term_grace=flags.term_grace,
        peer_recovery=flags.peer_recovery,
        inner_state_dir=str(flags.inner_state_dir) if flags.inner_state_dir else None,
    )
    resolve_device(flags.device)
    for address in flags.connect.split(","):
        check_spec(address.strip())
    if not 0 <= flags.learner_id < flags.learners:
        raise ValueError(f"--id must be in 0..{flags.learners - 1} (the data has {flags.learners} shards)")
    return settings
