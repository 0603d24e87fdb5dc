"""`ddiloco synchronizer`: one synchronizer shard as a service on a TCP address."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from . import app, options
from ._flags import takes
from .output import user_error

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..core.config import AlgorithmConfig
    from ..launch.dashboard import Dashboard
    from ..synchronizer.server import SynchronizerServer
    from ..synchronizer.service import SynchronizerService


def algorithm_for(method: str, learners: int, **knobs: Any) -> AlgorithmConfig:
    """The algorithm a method runs, as `core.methods.algorithm_for` says (the simulator's too);
    `merge` None: the method's default."""
    from ..core import methods
    from ..core.config import AlgorithmConfig

    if method not in methods.DILOCO_METHODS:
        raise ValueError(f"the runtime runs --method {', '.join(methods.DILOCO_METHODS)}, got {method!r}")
    knobs["merge"] = knobs.get("merge") or methods.default_merge(method)
    return AlgorithmConfig(**{**knobs, **methods.fixed_knobs(method, learners)})


def algorithm_of(flags: SynchronizerFlags, tensors: int) -> AlgorithmConfig:
    """The shard's algorithm: its flags (`options.algorithm_knobs`), P fitted to the model's `tensors`,
    then what --method sets."""
    from ..api.model import fit_fragments

    method, merge = options.plain(flags.method, flags.merge)
    fragments = fit_fragments(tensors, flags.fragments, flags.sync_every)
    return algorithm_for(method, flags.learners, fragments=fragments, merge=merge, **options.algorithm_knobs(flags))


@dataclass(frozen=True)
class SynchronizerFlags:
    """The flags of `ddiloco synchronizer`: one field per flag (`_flags.takes`)."""

    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default).")
    port: int = typer.Option(7070, min=0, max=65535, help="TCP port; 0 picks a free one (see --address-file).")
    address_file: Path | None = typer.Option(None, help="Write the host:port actually bound here (atomically).")
    model: options.Model = typer.Option("gpt", help="Builds the initial global parameters (unless --init).")
    model_size: options.ModelSize = typer.Option("default", help="default or tiny.")
    data: str | None = options.DATA
    seq_len: int = options.SEQ_LEN
    seed: int = typer.Option(0, help="Seed of the initial parameters.")
    init: Path | None = typer.Option(
        None,
        help="Initial parameters instead of --model: a safetensors file "
        "(ddiloco.save_initial(model, path) records the embeddings too) or a Hugging "
        "Face model folder (needs pip install 'ddiloco[hf]').",
    )
    plain_names: str | None = typer.Option(
        None,
        help="With --init: comma-separated tensors merged by plain "
        "averaging (embeddings); default: those the file records or the "
        "Hugging Face model's embeddings.",
    )
    method: options.RuntimeMethod = typer.Option(
        "decoupled",
        help="decoupled; streaming (Streaming DiLoCo: K=M, no grace, learners wait past tau); "
        "or diloco (synchronous baseline: P=1, tau=0, K=M).",
    )
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
    shard: int = typer.Option(0, min=0, help="This process's shard index.")
    num_shards: int = typer.Option(1, min=1, help="Shards in all: fragment p lives on shard p mod num_shards.")
    max_learners: int | None = typer.Option(
        None,
        min=1,
        max=2**20,
        help="Accept learner ids 0..N-1 only (default: --learners); bounds what the synchronizer keeps.",
    )
    checkpoint_dir: Path | None = typer.Option(None, help="Checkpoint folder; resumed from if it holds one.")
    checkpoint_every: int = typer.Option(
        1,
        min=0,
        help="Merges between checkpoints (1: write-ahead, no version a learner "
        "saw is ever lost; 0: only at the end and on SIGTERM).",
    )
    fresh: bool = typer.Option(False, help="Refuse to start if --checkpoint-dir already holds a checkpoint.")
    keep_versions: int = typer.Option(
        2, min=1, max=1000, help="Versions of each fragment the checkpoint keeps on disk."
    )
    budget_counts: options.BudgetCounts = typer.Option(
        "trained", help="What --tokens counts: every token the learners trained, or only those merged into the model."
    )
    tokens: int | None = typer.Option(
        None,
        min=options.TOKENS_MIN,
        max=options.TOKENS_MAX,
        help="Stop the run once the learners trained this many tokens.",
    )
    duration: float | None = typer.Option(
        None,
        min=options.DURATION_MIN,
        max=options.DURATION_MAX,
        help="Stop the run this many seconds after its first start (a restart from the checkpoint keeps it).",
    )
    heartbeat: float = options.HEARTBEAT
    failure_timeout: float | None = typer.Option(None, min=0.01, help="Declare a silent learner gone after this (6 h).")
    min_bandwidth: float | None = options.MIN_BANDWIDTH
    token: str | None = typer.Option(None, help="Shared secret (or $DDILOCO_TOKEN); required beyond loopback.")
    insecure_no_auth: bool = typer.Option(False, help="Allow listening beyond loopback without a token.")
    tls_cert: Path | None = typer.Option(None, help="TLS certificate (PEM).")
    tls_key: Path | None = typer.Option(None, help="TLS private key (PEM).")
    codec_down: options.CodecDown = typer.Option(
        options.CodecDown.bf16,
        help="Codec of global fragments sent to learners (the synchronizer's master copy stays fp32).",
    )
    bulk_socket: bool = typer.Option(
        True,
        help="Take pushes and fetches on a plain TCP port too (told to learners "
        "when they register; the token and TLS apply): about twice gRPC's speed for "
        "large fragments. Control always stays on gRPC.",
    )
    bulk_port: int = typer.Option(0, min=0, max=65535, help="Port of the bulk socket plane (0: any free one).")
    chunk_bytes: int = typer.Option(1 << 20, min=1024, max=1 << 26, help="Bytes per wire chunk.")
    max_message_bytes: int = typer.Option(
        1 << 30, min=1024, max=1 << 40, help="Largest contribution accepted, in bytes."
    )
    event_log: Path | None = typer.Option(None, help="Append events (merges, joins, rejections) as JSON lines.")
    summary: Path | None = typer.Option(None, help="Write the final status as JSON here on exit.")
    exit_when_done: bool = typer.Option(True, help="Exit once a stopped run has drained.")
    dashboard: bool = typer.Option(
        False,
        help="Serve the live web dashboard of this shard (its address is "
        "printed; the learners' sessions, versions, merges, goodput, training loss).",
    )
    dashboard_host: str = options.DASHBOARD_HOST
    dashboard_port: int = options.DASHBOARD_PORT
    threads: int = options.THREADS
    log_level: options.LogLevel = options.LOG_LEVEL


def _initial(flags: SynchronizerFlags, model: str, model_size: str) -> tuple[Mapping[str, Any], frozenset[str]]:
    """The initial global parameters (--init, else the model's), and the tensors merged by plain averaging.
    An --init safetensors file is read lazily (`synchronizer.initial`): the shard reads only its own."""
    from ..api.model import check_plain_names, load_initial

    if flags.init is not None:
        params, recorded = load_initial(flags.init, lazy=True)
        given = flags.plain_names.split(",") if flags.plain_names is not None else None
        plain = check_plain_names(given if given is not None else (recorded or ()), params)
        if given is None and recorded is None:
            logging.getLogger(__name__).warning(
                "%s records no embeddings: every tensor gets the radial-directional merge (name them with "
                "--plain-names, or save the file with ddiloco.save_initial)",
                flags.init,
            )
        return params, plain
    from ..train.tasks import make_task

    task = make_task(model, flags.data, seq_len=flags.seq_len, model_size=model_size)
    params = {n: p.detach() for n, p in task.build_model(flags.seed).named_parameters()}
    return params, frozenset(task.embedding_names)


def _service(flags: SynchronizerFlags) -> SynchronizerService:
    """The shard's service: its initial parameters, the method's algorithm, the settings, the checkpoint."""
    from ..api.model import balance_note
    from ..synchronizer.initial import TensorFile
    from ..synchronizer.server import build_service
    from ..synchronizer.settings import ServiceSettings
    from ..wire.timeouts import Timeouts

    model, model_size = options.plain(flags.model, flags.model_size)
    values, plain = _initial(flags, model, model_size)
    params = values.shapes if isinstance(values, TensorFile) else values  # shapes only: nothing read yet
    algorithm = algorithm_of(flags, len(params))
    note = balance_note(params, algorithm.fragments)
    if note:
        logging.getLogger(__name__).warning(note)
    extra = {} if flags.failure_timeout is None else {"failure": flags.failure_timeout}
    if flags.min_bandwidth is not None:
        extra["min_bandwidth"] = flags.min_bandwidth * 1e6
    settings = ServiceSettings(
        shard=flags.shard,
        num_shards=flags.num_shards,
        max_learners=flags.max_learners or flags.learners,
        codec_down=options.CodecDown(flags.codec_down).value,
        chunk_bytes=flags.chunk_bytes,
        max_message_bytes=flags.max_message_bytes,
        checkpoint_every=flags.checkpoint_every,
        tokens=flags.tokens,
        duration=flags.duration,
        timeouts=Timeouts.derive(flags.heartbeat, **extra),
        keep_versions=flags.keep_versions,
        budget_counts=options.plain(flags.budget_counts)[0],
    )
    return build_service(params, algorithm, settings, plain, flags.checkpoint_dir, flags.event_log, values=values)


def _dashboard(
    flags: SynchronizerFlags, service: SynchronizerService, server: SynchronizerServer, secret: str | None, tls: Any
) -> Dashboard | None:
    """--dashboard: the shard's web dashboard (HTTPS with the gRPC plane's certificate, `tls`), not started."""
    if not flags.dashboard:
        return None
    from ..launch.dashboard import Dashboard
    from ..launch.shardstate import ShardState
    from ..wire import auth

    try:
        auth.require_token_policy(flags.dashboard_host, secret, False)
        state = ShardState(service.status, options.plain(flags.method)[0], flags.learners, flags.duration, flags.tokens)
        return Dashboard(state, flags.dashboard_host, flags.dashboard_port, secret, tls=tls)
    except (ValueError, OSError) as exc:
        server.stop()
        raise typer.BadParameter(str(exc), param_hint="--dashboard-host/--dashboard-port") from None


@app.command("synchronizer")
@takes(SynchronizerFlags)
def synchronizer(flags: SynchronizerFlags) -> None:
    """Serve one synchronizer shard: merges learners' outer gradients, checkpoints, never waits for the dead."""

    from ..records import logsetup
    from ..records.atomic import atomic_write
    from ..synchronizer.heap import return_freed_memory
    from ..synchronizer.server import SynchronizerServer
    from ..wire import auth, runend

    logsetup.configure(f"sync{flags.shard}", options.plain(flags.log_level)[0])
    options.set_threads(flags.threads)
    return_freed_memory()  # this process only: a library user's own process keeps its allocator policy
    try:
        secret = auth.resolve_token(flags.token)
        auth.require_token_policy(flags.host, secret, flags.insecure_no_auth)
        if flags.fresh and flags.checkpoint_dir is not None and (flags.checkpoint_dir / "manifest.json").is_file():
            raise ValueError(f"{flags.checkpoint_dir} already holds a checkpoint and --fresh was given")
        service = _service(flags)
        credentials = auth.server_credentials(flags.tls_cert, flags.tls_key)
        server = SynchronizerServer(
            service,
            flags.host,
            flags.port,
            secret,
            credentials,
            bulk_socket=flags.bulk_socket,
            bulk_port=flags.bulk_port,
        )
        address = server.start()
    except (ValueError, OSError, FileNotFoundError) as exc:
        raise user_error(exc) from None
    board = _dashboard(flags, service, server, secret, credentials.ssl if credentials is not None else None)
    if flags.address_file is not None:
        runend.marker_path(flags.address_file).unlink(missing_ok=True)  # a shard that starts: the run is not over
        atomic_write(flags.address_file, address.encode())
    print(f"synchronizer shard {flags.shard}/{flags.num_shards} listening on {address}", flush=True)
    if board is not None:
        print(f"dashboard: {board.start()}", flush=True)

    stop = threading.Event()

    def on_signal(signum, frame):  # noqa: ANN001
        stop.set()

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    while not stop.is_set():
        if flags.exit_when_done and service.finished.is_set():
            break
        stop.wait(0.2)
    if board is not None:
        board.stop()
    _finish(flags, service, server)


def _finish(flags: SynchronizerFlags, service: SynchronizerService, server: SynchronizerServer) -> NoReturn:
    """Stop serving (the final checkpoint), write the summary and the run's end beside the address file,
    print the counts; exit 0 when the run is over, 1 when something could not be written."""
    from ..records.atomic import atomic_write
    from ..wire import runend

    failed = None
    try:
        server.stop()
    except Exception as exc:  # noqa: BLE001 - OSError, or safetensors' own error: the servers are down either way
        failed = f"the final checkpoint could not be written (the run resumes from the last one): {exc}"
    status = service.status()
    if flags.summary is not None:
        try:
            atomic_write(flags.summary, json.dumps(status, indent=1, sort_keys=True).encode())
        except OSError as exc:
            failed = failed or f"the summary could not be written: {exc}"
    if flags.address_file is not None and status["finished"]:  # learners cut off across the end stop at once
        try:
            atomic_write(runend.marker_path(flags.address_file), runend.encode(status))
        except OSError as exc:
            failed = failed or f"the run's end could not be marked beside {flags.address_file}: {exc}"
    if failed:
        logging.getLogger(__name__).error(failed)
        sys.exit(1)
    keys = ("versions", "merges", "contributions", "rejected_contributions", "tokens_reported", "tokens_merged")
    print(json.dumps({k: status[k] for k in keys}), flush=True)
    # 0 only when the run is over; stopped by a signal before that (checkpoint written): 128 + SIGTERM
    sys.exit(0 if status["finished"] else 128 + signal.SIGTERM)
