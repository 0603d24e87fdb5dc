"""Authentication: a shared secret on every RPC, required whenever the service listens beyond
loopback; TLS as an option.

The token travels in the `x-ddiloco-token` metadata of each call and is compared in constant time by
a server interceptor, so no handler runs for an unauthenticated call. Without TLS the token is sent in
clear text: fine on loopback or a private network, use --tls-cert/--tls-key otherwise.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, cast

import grpc

TOKEN_METADATA = "x-ddiloco-token"
TOKEN_ENV = "DDILOCO_TOKEN"
log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """True when `host` only ever resolves to loopback addresses."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return False
        return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def resolve_token(token: str | None) -> str | None:
    """The token from the flag, else from $DDILOCO_TOKEN, else None."""
    token = token if token is not None else os.environ.get(TOKEN_ENV)
    return token or None


def require_token_policy(host: str, token: str | None, allow_insecure: bool) -> None:
    """Refuse to listen beyond loopback without a shared secret unless explicitly told to."""
    if token is None and not is_loopback(host) and not allow_insecure:
        raise ValueError(
            f"listening on {host!r} (beyond loopback) needs a shared secret: pass --token or set ${TOKEN_ENV} "
            "(or --insecure-no-auth to accept anyone, not recommended)"
        )


def token_matches(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


class TokenInterceptor(grpc.ServerInterceptor):
    """Aborts UNAUTHENTICATED before any handler runs when the token is missing or wrong."""

    def __init__(self, token: str, on_reject: Callable[[str, str], None] | None = None) -> None:
        self.token = token
        self.on_reject = on_reject or (lambda method, reason: None)

        def deny(request: object, context: grpc.ServicerContext) -> NoReturn:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong or missing auth token (x-ddiloco-token)")

        self._deny_unary: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream_in: grpc.RpcMethodHandler[bytes, bytes] = grpc.stream_unary_rpc_method_handler(deny)
        self._deny_stream_out: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_stream_rpc_method_handler(deny)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        # a metadata value is str unless its key ends in "-bin"
        given = cast("str | None", dict(handler_call_details.invocation_metadata or ()).get(TOKEN_METADATA))
        if token_matches(self.token, given):
            return continuation(handler_call_details)
        reason = "missing auth token" if given is None else "wrong auth token"
        path = str(handler_call_details.method)[:64]  # chosen by the caller: never logged whole
        log.debug("rejected %s: %s", path, reason)
        self.on_reject(path, reason)  # the service counts it and logs it, rate-limited
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if method == "Push":
            return self._deny_stream_in
        if method in ("Subscribe", "Fetch"):
            return self._deny_stream_out
        return self._deny_unary


@dataclass(frozen=True)
class Tls:
    """TLS for both planes: gRPC's credentials, and the same certificates as an `ssl` context for the
    bulk socket plane (`sockets`). Pass it wherever gRPC credentials go."""

    grpc: object  # grpc.ServerCredentials or grpc.ChannelCredentials
    ssl: ssl.SSLContext


def server_credentials(cert: Path | None, key: Path | None) -> Tls | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    return Tls(grpc.ssl_server_credentials([(Path(key).read_bytes(), Path(cert).read_bytes())]), context)


def channel_credentials(ca: Path | None) -> Tls | None:
    if ca is None:
        return None
    return Tls(
        grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes()),
        ssl.create_default_context(cafile=str(ca)),
    )


def grpc_part(credentials: object) -> object:
    """gRPC's credentials from a `Tls` or from gRPC credentials given directly."""
    return credentials.grpc if isinstance(credentials, Tls) else credentials


def ssl_part(credentials: object) -> ssl.SSLContext | None:
    """The `ssl` context of a `Tls`; None for plain gRPC credentials (the bulk socket plane is then not used)."""
    return credentials.ssl if isinstance(credentials, Tls) else None


def tls_mismatch(address: str, credentials: object, timeout: float = 5.0) -> str | None:
    """Why a TLS connection to `address` ("host:port") fails on the server's certificate, naming the
    names it holds (its subjectAltName), for the one line a learner ends with; None when the
    certificate is not the problem, or cannot be fetched. gRPC only says "unavailable" (#46)."""
    context = ssl_part(credentials)
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if context is None or not host or not port.isdigit():
        return None
    check = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    check.check_hostname = False  # the chain is verified; the name is compared below, to be named
    for der in context.get_ca_certs(binary_form=True):
        check.load_verify_locations(cadata=der)
    try:
        with socket.create_connection((host, int(port)), timeout) as raw, check.wrap_socket(raw) as tls:
            cert = tls.getpeercert() or {}
    except ssl.SSLCertVerificationError as exc:
        return f"TLS: the certificate of {address} is not signed by the CA given ({exc.verify_message})"
    except (OSError, ValueError):
        return None
    entries = cast("tuple[tuple[str, str], ...]", cert.get("subjectAltName", ()))  # typeshed types it loosely
    alt = [(str(kind), str(value)) for kind, value in entries]
    if any(_name_matches(host, kind, value) for kind, value in alt):
        return None
    names = ", ".join(f"{kind}:{value}" for kind, value in alt) or "no subjectAltName at all"
    return (
        f"TLS name mismatch: the certificate of {address} is for {names}, not {host!r}; connect by one of "
        "those names or issue a certificate that names this one"
    )


def _name_matches(host: str, kind: str, value: str) -> bool:
    """Whether a subjectAltName entry names `host` (an address, or a DNS name with at most a leading
    wildcard label), as TLS's own check decides."""
    if kind == "IP Address":
        try:
            return ipaddress.ip_address(host) == ipaddress.ip_address(value.strip())
        except ValueError:
            return False
    if kind != "DNS":
        return False
    host, value = host.lower().rstrip("."), value.lower().rstrip(".")
    if value.startswith("*."):
        return "." in host and host.split(".", 1)[1] == value[2:]
    return host == value
