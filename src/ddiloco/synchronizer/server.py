"""Building and running one synchronizer shard: core + checkpoint store + service + gRPC server."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from ..core import AlgorithmConfig, SynchronizerCore, plan_for_model
from ..core.fragments import plan_by_names
from ..records.events import EventLog
from ..wire import auth, rpc
from ..wire.protocol import plan_to_json, signature
from ..wire.routing import owned_fragments
from .bulk_socket import BulkSocketServer
from .checkpoint import CheckpointStore
from .grpc_front import GrpcFront
from .handlers import Handlers
from .service import SynchronizerService
from .settings import ServiceSettings

if TYPE_CHECKING:
    import grpc

log = logging.getLogger(__name__)


def build_service(
    params: Mapping[str, torch.Tensor],
    algorithm: AlgorithmConfig,
    settings: ServiceSettings,
    plain_names: frozenset[str] = frozenset(),
    checkpoint_dir: str | Path | None = None,
    event_log: str | Path | None = None,
    fragment_names: Sequence[Sequence[str]] | None = None,
    values: Mapping[str, torch.Tensor] | None = None,
) -> SynchronizerService:
    """The service for shard settings.shard of settings.num_shards, restored from checkpoint_dir if it
    holds a checkpoint. Only the owned fragments are kept; the rest of `params` can be dropped.
    `fragment_names`: the fragments by parameter name (e.g. layer-wise, from module names) instead of
    the balanced split; as many as `algorithm.fragments`. Learners take the plan from the shard.
    `values`: where the owned tensors are read from, each once, when `params` gives only the shapes
    (meta tensors; e.g. a `TensorFile` and its `shapes`): the default is `params` itself."""
    if fragment_names is None:
        plan = plan_for_model(params, algorithm.fragments)
    else:
        plan = plan_by_names(params, fragment_names)
        if plan.num_fragments != algorithm.fragments:
            raise ValueError(f"{plan.num_fragments} fragments by name, but the algorithm has {algorithm.fragments}")
    owned = owned_fragments(settings.shard, settings.num_shards, plan.num_fragments)
    core = SynchronizerCore(
        algorithm,
        plan,
        params if values is None else values,
        owned=owned,
        plain_names=plain_names & set(params),
        defer_merges=True,
        share_updates=True,
    )
    plan_json = plan_to_json(plan, params)
    identity = {
        "signature": signature(params),
        "plan": hashlib.sha256(json.dumps(plan_json["names"]).encode()).hexdigest()[:16],
        "shard": settings.shard,
        "num_shards": settings.num_shards,
    }
    store = CheckpointStore(checkpoint_dir, settings.keep_versions) if checkpoint_dir is not None else None
    return SynchronizerService(core, settings, identity, plan_json, store, EventLog(event_log))


class SynchronizerServer:
    """The gRPC server around a service. `start()` returns the address it listens on."""

    def __init__(
        self,
        service: SynchronizerService,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        credentials=None,  # grpc.ServerCredentials, or auth.Tls (needed for TLS on the bulk socket plane)
        bulk_socket: bool = True,
        bulk_port: int = 0,
    ) -> None:
        """`bulk_socket`: also serve pushes and fetches on a plain TCP port (`bulk_port`, 0: any free one;
        `wire.sockets`), which learners learn at registration: about twice gRPC's speed for
        fragment-sized tensors, and no gRPC buffers in the synchronizer's memory."""
        self.service = service
        self.host = host
        self.port = port
        self.token = token
        self.credentials = auth.grpc_part(credentials)
        self.bulk_tls = auth.ssl_part(credentials)
        if bulk_socket and credentials is not None and self.bulk_tls is None:
            log.warning(
                "TLS was given as bare gRPC credentials, which the bulk socket plane cannot use: serving "
                "bulk on gRPC only (give auth.server_credentials(cert, key) for both planes)"
            )
            bulk_socket = False
        self.bulk_socket, self.bulk_port = bulk_socket, bulk_port
        self.bulk: BulkSocketServer | None = None
        settings = service.settings
        interceptors = (auth.TokenInterceptor(token, lambda m, r: service.refuse_rpc(m, r)),) if token else ()
        self.handlers = Handlers(service)
        self.server = rpc.make_server(
            self.handlers.table(),
            max_frame=settings.chunk_bytes + rpc.FRAME_MARGIN,
            workers=cast(int, settings.workers),  # `ServiceSettings` sets it when not given
            interceptors=interceptors,
        )
        self.front: GrpcFront | None = None
        self.address: str | None = None

    def start(self) -> str:
        """Listens (the port is `grpc_front`'s; gRPC itself listens behind it on a unix socket) and serves."""
        settings = self.service.settings
        self.front = GrpcFront(
            self.host,
            self.port,
            self.credentials is not None,
            settings.grpc_waiting_per_address,
            settings.grpc_waiting,
            settings.grpc_preface_seconds,
        )
        target = self.front.backend_target
        try:
            if self.credentials is not None:
                # gRPC's part of the server credentials given (`auth.grpc_part` types it as any object)
                bound = self.server.add_secure_port(target, cast("grpc.ServerCredentials", self.credentials))
            else:
                bound = self.server.add_insecure_port(target)
        except RuntimeError as exc:
            bound = 0
            log.debug("gRPC cannot listen on %s: %s", target, exc)
        if not bound:
            self.front.stop()
            raise OSError(f"gRPC cannot listen on {target}")
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        self.address = f"{host}:{self.front.port}"
        if self.bulk_socket:
            try:
                self.bulk = BulkSocketServer(self.handlers, self.host, self.token, self.bulk_tls, self.bulk_port)
            except OSError:
                self.front.stop()
                self.server.stop(0)  # the gRPC port is let go too
                raise
            self.handlers.bulk_port = self.bulk.start()
        self.service.start()
        self.server.start()
        self.front.start()
        log.info(
            "synchronizer shard %d/%d listening on %s",
            self.service.settings.shard,
            self.service.settings.num_shards,
            self.address,
        )
        return self.address

    def stop(self, grace: float = 1.0) -> None:
        """Final checkpoint, then close every stream and the listening socket. Waits until gRPC's
        threads are done (bounded): a process that exits while one is still inside gRPC's C core can
        abort at interpreter shutdown ("terminate called without an active exception")."""
        try:
            self.service.close()
        finally:  # a failed final checkpoint raises after the servers stopped: no RPC thread outlives this
            if self.bulk is not None:
                self.bulk.stop()
            if self.front is not None:
                self.front.stop()
            if not self.server.stop(grace).wait(grace + 10.0):
                log.warning("the gRPC server did not finish stopping within %.0f s", grace + 10.0)
