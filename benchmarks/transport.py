"""Transport: fragment push and pull throughput of our wire format over gRPC against a plain TCP socket
moving the same bytes on loopback, measured side by side in one run.

Every path starts from a float32 tensor and ends with a float32 tensor, with the same codec (push:
bf16 outer gradient; pull: fp32 global fragment), so what differs is only how the bytes travel:

* plain TCP, bytes only (the real limit): the same byte counts over one TCP connection, no
  conversion and no copies on either side; `ratio_vs_raw` is the synchronizer's throughput over this;
* gRPC, bytes only (gRPC's own ceiling): the same byte counts in messages of one chunk each through
  a gRPC server made like ours, nothing else done on either side; `grpc_vs_raw` is its throughput
  over the plain socket's, and `ratio_vs_grpc` the synchronizer's over it;
* plain TCP with conversion, push only: the raw connection, the float32 values converted to bf16
  chunk by chunk as they are sent (the limit for a sender that must convert:
  `convert_push_ratio_vs_raw`; our pushes against it: `push_ratio_vs_convert`);
* plain TCP: tensor -> bytes -> one TCP connection (sendall / recv_into a preallocated buffer) ->
  tensor, between two Python processes; no header, no chunking;
* ddiloco transport: tensor -> framed chunks with the JSON header -> gRPC bulk channel (HTTP/2) ->
  reassembly with the size limit -> shape-checked decode -> tensor (our `wire` + `rpc` modules in a
  server process, without the synchronizer's algorithm);
* ddiloco service (for information): the same through a real `ddiloco synchronizer`, whose push also
  runs the core's checks (one norm pass over every tensor); its quorum cannot be reached, so no
  merge is timed;
* under TLS (unless --no-tls): the same bytes over one plain TLS connection (the limit under TLS),
  and the synchronizer's bulk socket plane with a self-signed certificate made for the run
  (`tls_ratio_vs_raw`, with `tls_push_ratio_vs_raw` and `tls_pull_ratio_vs_raw`); and the raw TLS
  connection's pushes with the float32 values converted to bf16 chunk by chunk as they are sent, the
  limit for a sender that must convert (`tls_convert_push_ratio_vs_raw`; our pushes against it:
  `tls_push_ratio_vs_convert`).

The ratio is ddiloco transport over plain TCP for push + pull together.

    python benchmarks/transport.py                 # 16M-parameter fragment, ~1 minute
    python benchmarks/transport.py --quick --json
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from ddiloco.launch.procs import ProcessTable
from ddiloco.wire import framing

console = Console(stderr=True, width=150)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transport_ends import (  # noqa: E402
    GRPC_BYTES_SERVER,
    WIRE_SERVER,
    GrpcBytes,
    Ours,
    Raw,
    RawConverting,
    RawTls,
    Tcp,
    local_address,
    self_signed,
    start_service,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=int, default=16 * 1024 * 1024, help="parameters in the fragment")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--chunk-bytes", type=int, default=framing.DEFAULT_CHUNK_BYTES)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-tls", action="store_true", help="leave out the TLS paths (they need `openssl`)")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # so `finally` ends the children
    if args.quick:
        args.params, args.repeats = 2 * 1024 * 1024, 4
    torch.set_num_threads(1)
    numel, chunk = args.params, args.chunk_bytes
    procs = ProcessTable()
    times: dict[str, dict[str, list[float]]] = {}
    sizes: dict[str, dict[str, int]] = {}
    grad = torch.randn(numel) * 1e-3
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        try:
            tcp = Tcp(procs, numel, tmp)
            backends = {
                "raw": Raw(tcp, 2 * numel, 4 * numel),  # the same connection, used in turn
                "raw_convert": RawConverting(Raw(tcp, 2 * numel, 4 * numel), chunk),
                "tcp": tcp,
                "grpc": GrpcBytes(
                    local_address(
                        procs, "grpc", [sys.executable, "-c", GRPC_BYTES_SERVER, str(4 * numel), str(chunk)], tmp
                    ),
                    2 * numel,
                    chunk,
                ),
                "transport": Ours(
                    local_address(procs, "wire", [sys.executable, "-c", WIRE_SERVER, str(numel), str(chunk)], tmp),
                    numel,
                    chunk,
                ),
                "service": start_service(procs, tmp, numel, chunk),
                "socket": start_service(procs, tmp, numel, chunk, bulk_socket=True),
            }
            if not args.no_tls:
                cert, key = self_signed(tmp)
                backends["raw_tls"] = RawTls(procs, tmp, cert, key, 2 * numel, 4 * numel)
                backends["raw_tls_convert"] = RawConverting(backends["raw_tls"], chunk)
                backends["socket_tls"] = start_service(procs, tmp, numel, chunk, bulk_socket=True, tls=(cert, key))
            for name in backends:
                times[name] = {"push": [], "pull": []}
                sizes[name] = {}
            for _ in range(args.repeats + 1):  # the first round warms up and is not counted
                for name, backend in backends.items():  # interleaved: every path sees the same machine
                    if isinstance(backend, Ours):
                        backend.keep_alive()
                    for op in ("push", "pull"):
                        t0 = time.perf_counter()
                        sizes[name][op] = backend.push(grad) if op == "push" else backend.pull()
                        times[name][op].append(time.perf_counter() - t0)
        finally:
            procs.stop_all()
    med = {n: {op: statistics.median(v[1:]) for op, v in ops.items()} for n, ops in times.items()}
    mbps = {n: {op: sizes[n][op] / med[n][op] / 1e6 for op in ("push", "pull")} for n in med}

    def both(n: str, reference: str = "tcp") -> float:  # bytes of the reference over the time of n
        return (sizes[reference]["push"] + sizes[reference]["pull"]) / (med[n]["push"] + med[n]["pull"]) / 1e6

    result = {
        "params": numel,
        "chunk_bytes": chunk,
        "tcp_push_bytes": sizes["tcp"]["push"],
        "tcp_pull_bytes": sizes["tcp"]["pull"],
        "wire_push_bytes": sizes["transport"]["push"],
        "wire_pull_bytes": sizes["transport"]["pull"],
        **{f"{n}_{op}_MBps": mbps[n][op] for n in mbps for op in ("push", "pull")},
        "tcp_MBps": both("tcp"),
        "transport_MBps": both("transport"),
        "service_MBps": both("service"),
    }
    result["push_ratio"] = med["tcp"]["push"] / med["transport"]["push"]
    result["pull_ratio"] = med["tcp"]["pull"] / med["transport"]["pull"]
    result["ratio"] = result["transport_MBps"] / result["tcp_MBps"]
    result["service_ratio"] = result["service_MBps"] / result["tcp_MBps"]
    result["socket_MBps"] = both("socket")
    result["raw_MBps"] = both("raw")
    result["socket_vs_raw"] = result["socket_MBps"] / result["raw_MBps"]
    result["ratio_vs_raw"] = result["socket_MBps"] / result["raw_MBps"]  # the synchronizer's default plane
    for op in ("push", "pull"):  # the aim (#48) holds for pushes and fetches alike
        result[f"{op}_ratio_vs_raw"] = med["raw"][op] / med["socket"][op]
    # what converting alone costs a raw sender, and how near our pushes come to that
    result["convert_push_ratio_vs_raw"] = med["raw"]["push"] / med["raw_convert"]["push"]
    result["push_ratio_vs_convert"] = med["raw_convert"]["push"] / med["socket"]["push"]
    if "socket_tls" in med:  # the bulk plane over TLS against a raw TLS socket moving the same bytes
        result["raw_tls_MBps"] = both("raw_tls")
        result["socket_tls_MBps"] = both("socket_tls")
        result["tls_ratio_vs_raw"] = result["socket_tls_MBps"] / result["raw_tls_MBps"]
        for op in ("push", "pull"):
            result[f"tls_{op}_ratio_vs_raw"] = med["raw_tls"][op] / med["socket_tls"][op]
        # what converting alone costs a raw TLS sender, and how near our pushes come to that
        result["tls_convert_push_ratio_vs_raw"] = med["raw_tls"]["push"] / med["raw_tls_convert"]["push"]
        result["tls_push_ratio_vs_convert"] = med["raw_tls_convert"]["push"] / med["socket_tls"]["push"]
    result["grpc_plane_vs_raw"] = result["service_MBps"] / result["raw_MBps"]
    result["transport_vs_raw"] = result["transport_MBps"] / result["raw_MBps"]
    result["grpc_MBps"] = both("grpc")
    result["grpc_vs_raw"] = result["grpc_MBps"] / result["raw_MBps"]
    result["ratio_vs_grpc"] = result["service_MBps"] / result["grpc_MBps"]  # the gRPC plane against gRPC alone
    table = Table(
        title=f"fragment of {numel / 1e6:.1f}M parameters on loopback: MB/s of tensor data (median of {args.repeats})"
    )
    for col in ("path", "push (bf16)", "pull (fp32)", "push + pull", "ratio to TCP"):
        table.add_column(col, justify="right")
    for n, label in (
        ("raw", "plain TCP, bytes only"),
        ("raw_convert", "plain TCP + bf16 conversion (push only)"),
        ("grpc", "gRPC, bytes only"),
        ("tcp", "plain TCP + bf16/fp32 conversion"),
        ("transport", "ddiloco wire + gRPC"),
        ("service", "ddiloco synchronizer, gRPC plane"),
        ("socket", "ddiloco synchronizer, bulk socket plane"),
        ("raw_tls", "plain TLS, bytes only"),
        ("raw_tls_convert", "plain TLS + bf16 conversion (push only)"),
        ("socket_tls", "ddiloco synchronizer, bulk socket plane, TLS"),
    ):
        if n not in med:
            continue
        push = sizes["tcp"]["push"] / med[n]["push"] / 1e6
        pull = sizes["tcp"]["pull"] / med[n]["pull"] / 1e6
        table.add_row(label, f"{push:.0f}", f"{pull:.0f}", f"{both(n):.0f}", f"{both(n) / both('tcp'):.2f}")
    console.print(table)
    console.print(
        f"against the same bytes over a plain socket with no conversion (the real limit): through the "
        f"synchronizer's bulk socket plane (its default) [bold]{result['ratio_vs_raw']:.2f}[/bold] "
        f"(ratio_vs_raw; aim >= 0.8: push {result['push_ratio_vs_raw']:.2f}, pull {result['pull_ratio_vs_raw']:.2f}), "
        f"through its gRPC plane {result['grpc_plane_vs_raw']:.2f} (grpc_plane_vs_raw); a plain socket that converts "
        f"the pushed values to bf16 as it sends pushes at {result['convert_push_ratio_vs_raw']:.2f} of it "
        f"(convert_push_ratio_vs_raw), and our pushes at {result['push_ratio_vs_convert']:.2f} of that "
        f"(push_ratio_vs_convert)"
    )
    if "tls_ratio_vs_raw" in result:
        console.print(
            f"under TLS, against the same bytes over a plain TLS socket: [bold]{result['tls_ratio_vs_raw']:.2f}[/bold] "
            f"(tls_ratio_vs_raw: push {result['tls_push_ratio_vs_raw']:.2f}, "
            f"pull {result['tls_pull_ratio_vs_raw']:.2f}); a plain TLS socket that converts the pushed values to "
            f"bf16 as it sends pushes at {result['tls_convert_push_ratio_vs_raw']:.2f} of it "
            f"(tls_convert_push_ratio_vs_raw), and our pushes at {result['tls_push_ratio_vs_convert']:.2f} of that "
            f"(tls_push_ratio_vs_convert)"
        )
    console.print(
        f"gRPC itself, moving the same bytes in the same messages with nothing else to do, reaches "
        f"{result['grpc_vs_raw']:.2f} of the plain socket (grpc_vs_raw); the gRPC plane reaches "
        f"{result['ratio_vs_grpc']:.2f} of that (ratio_vs_grpc)"
    )
    console.print(
        f"against the converting plain TCP baseline (ratio): wire + gRPC {result['ratio']:.2f}, "
        f"gRPC plane {result['service_ratio']:.2f}"
    )
    if args.json:
        print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
