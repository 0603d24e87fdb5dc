"""Issue 28's multi-host checks, each across real network-namespace hosts (real processes, kernel TCP
between 198.18.x.y addresses, never loopback for the part that crosses hosts):

- TLS verified against an IP address in the certificate, on both planes (gRPC and the bulk socket),
  and a certificate that names only localhost/127.0.0.1 refused by a learner on another host;
- the token rule off loopback: a wrong token refused on both planes, the right one merged;
- the bulk socket plane and the dashboard reached at the address the synchronizer advertises;
- peer recovery across hosts: a learner joining empty on host c takes its inner state from a live
  learner on host b (through the synchronizer on host sync).

One network and one synchronizer (TLS, token, bulk socket, dashboard) serve the whole module; learner
0 on host b trains against it throughout. What the tests ask the synchronizer, they ask from another
host (`hostclient.py`): Status and the dashboard from host b, calls on the bulk socket from host c (so
that from host b only learner 0 uses the bulk port). The test process itself, in the root namespace,
has no route to the hosts.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from ddiloco.launch.dashauth import view_credential

from ..support.processes import model_args
from ..support.runtime import wait_for
from .conftest import close_and_check, new_network

TOKEN = "multihost-secret"
PORT, BULK_PORT, BOARD_PORT = 7070, 7071, 7080  # each host has ports of its own: fixed ones cannot clash
LEARNERS = 3  # 0: the module's learner on b; 1: refused ones; 2: the joiner on c
CLIENT = str(Path(__file__).with_name("hostclient.py"))
TOOK = re.compile(r"learner 2 took its inner state from learner (\d) \(step (\d+), checksum ([0-9a-f]{64})\)")
DONATED = re.compile(r"donated the inner state \(\d+ tensors, [\d.]+ MB, checksum ([0-9a-f]{64})\)")


def _ddiloco(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddiloco", *args]


def make_cert(folder: Path, san: str) -> tuple[Path, Path]:
    """A self-signed certificate (its own CA) whose subjectAltName is `san`, and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not available to make a test certificate")
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "1", "-subj", "/CN=ddiloco-test", "-addext", f"subjectAltName={san}"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


class Client:
    """hostclient.py in a host: one JSON request, one JSON answer, each read with a timeout."""

    def __init__(self, net, host: str) -> None:
        self.proc = net.popen(host, [sys.executable, CLIENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def ask(self, timeout: float = 30.0, **request: object) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the host client said nothing within {timeout} s to {request}") from None
        assert line is not None, f"the host client ended (code {self.proc.poll()})"
        return json.loads(line)


def start_synchronizer(net, folder: Path, data: str, cert: Path, key: Path, port: int, bulk_port: int, *extra: str):
    """`ddiloco synchronizer` on host sync at its own address, with TLS and the token."""
    folder.mkdir(parents=True)
    cmd = _ddiloco(
        "synchronizer",
        *("--host", net.address("sync"), "--port", str(port), "--bulk-port", str(bulk_port)),
        *("--address-file", str(folder / "address"), "--tls-cert", str(cert), "--tls-key", str(key)),
        *model_args(data, LEARNERS),
        *("--fragments", "2", "--sync-every", "4", "--overlap", "2", "--heartbeat", "0.5"),
        *("--tokens", str(10**9), "--duration", "900", "--max-learners", str(LEARNERS)),
        *("--checkpoint-dir", str(folder), "--event-log", str(folder / "events.jsonl")),
        *extra,
    )
    with open(folder / "stderr.log", "wb") as err, open(folder / "stdout.log", "wb") as out:
        proc = net.popen("sync", cmd, env={**os.environ, "DDILOCO_TOKEN": TOKEN}, stdout=out, stderr=err)
    path = folder / "address"

    def address() -> str:
        assert proc.poll() is None, (folder / "stderr.log").read_text()[-3000:]
        return path.read_text() if path.is_file() else ""

    return proc, wait_for(address, 120, message="the synchronizer's address")


def start_learner(net, host: str, folder: Path, data: str, address: str, m: int, ca: Path, token: str, *extra: str):
    folder.mkdir(parents=True)
    cmd = _ddiloco(
        "learner",
        *("--connect", address, "--id", str(m), "--tls-ca", str(ca)),
        *model_args(data, LEARNERS),
        *("--batch-size", "4", "--threads", "1", "--state-dir", str(folder), "--min-step-seconds", "0.1"),
        *extra,
    )
    with open(folder / "stderr.log", "wb") as err, open(folder / "stdout.log", "wb") as out:
        return net.popen(host, cmd, env={**os.environ, "DDILOCO_TOKEN": token}, stdout=out, stderr=err)


def refused(learner: subprocess.Popen, folder: Path, timeout: float = 60) -> str:
    """The learner's stderr once it exited with code 2 (refused); fails if it runs on instead."""
    try:
        code = learner.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the learner was not refused within {timeout} s: it runs on") from None
    err = (folder / "stderr.log").read_text()
    assert code == 2, (code, err[-3000:])
    return err


@dataclass
class Run:
    net: object
    tmp: Path
    data: str
    cert: Path
    address: str  # what the synchronizer advertises (its address file)
    board: str  # the dashboard's address, as the synchronizer printed it
    client: Client  # on host b: Status over gRPC, the dashboard
    prober: Client  # on host c: calls on the bulk socket (so that from host b only learner 0 uses it)

    def status(self, token: str = TOKEN, ca: Path | None = None) -> dict:
        return self.client.ask(op="status", address=self.address, token=token, ca=str(ca or self.cert))

    def book(self, m: int) -> dict:
        got = self.status()
        assert got["ok"], got
        return got["status"]["books"].get(str(m), {})

    def bulk(self, token: str = TOKEN, ca: Path | None = None, port: int = BULK_PORT) -> dict:
        host = self.address.rpartition(":")[0]
        return self.prober.ask(op="bulk", host=host, port=port, token=token, ca=str(ca or self.cert))

    def wait_merged(self, m: int, timeout: float = 120) -> dict:
        return wait_for(
            lambda: self.book(m).get("tokens_merged", 0) > 0 and self.book(m),
            timeout,
            0.5,
            f"learner {m}'s work merged",
        )


@pytest.fixture(scope="module")
def run(tmp_path_factory, shakespeare):
    net = new_network(["sync", "b", "c"])  # unshaped: round trips far below the bulk socket's limit
    try:
        tmp = tmp_path_factory.mktemp("multihost")
        sync_ip = net.address("sync")
        cert, key = make_cert(tmp / "cert-ip", f"IP:{sync_ip}")  # the host's address, and nothing else
        _, address = start_synchronizer(
            net,
            tmp / "sync",
            shakespeare,
            cert,
            key,
            PORT,
            BULK_PORT,
            *("--dashboard", "--dashboard-host", sync_ip, "--dashboard-port", str(BOARD_PORT)),
        )
        start_learner(net, "b", tmp / "learner-0", shakespeare, address, 0, cert, TOKEN)
        out = tmp / "sync" / "stdout.log"
        board = wait_for(lambda: re.search(r"dashboard: (\S+)", out.read_text()), 60, message="the dashboard")
        yield Run(net, tmp, shakespeare, cert, address, board.group(1), Client(net, "b"), Client(net, "c"))
    finally:
        close_and_check(net)


def _bulk_connections(net, host: str, peer: str) -> list[str]:
    """TCP connections (any state, TIME-WAIT included) between `host` and `peer` on the bulk port."""
    out = subprocess.run(net.command(host, ["ss", "-Htan"]), capture_output=True, text=True, timeout=30, check=True)
    ends = {f"{net.address(peer)}:", f":{BULK_PORT}"}
    return [line for line in out.stdout.splitlines() if all(e in line for e in ends)]


def learner_pushes_on_the_bulk_socket(run: Run) -> list[str]:
    """The connections learner 0 (the only process on host b that calls the bulk port) made to the
    advertised bulk port: one per push; a closed one stays a minute in TIME-WAIT at the end that
    closed first. Its log says the socket was never given up for gRPC (a connection or handshake that
    failed), and the synchronizer counted no failed handshake on that plane."""
    found = wait_for(
        lambda: _bulk_connections(run.net, "sync", "b") + _bulk_connections(run.net, "b", "sync"),
        60,
        0.5,
        "a connection from host b to the bulk socket",
    )
    log = (run.tmp / "learner-0" / "stderr.log").read_text()
    assert "cannot reach the synchronizer's bulk socket" not in log, log[-3000:]  # a failed connect or handshake
    closed = run.status()["status"]["bulk"]["closed"]
    assert "tls_handshake" not in closed, closed
    return found


def test_tls_verified_against_an_ip_address_in_the_certificate(run):
    sync_ip = run.net.address("sync")
    assert run.address == f"{sync_ip}:{PORT}"  # advertised at the host's own address, not loopback
    # gRPC from host b, verified against IP:198.18.0.1 (the certificate names no host name at all)
    assert run.wait_merged(0)["contributions"] > 0  # the learner on host b, verifying the same way
    assert learner_pushes_on_the_bulk_socket(run)  # its pushes: TLS on the bulk plane, verified the same way
    # the bulk socket plane: the TCP connection, the handshake checked against the IP, then the token;
    # only then is the (made-up) session looked at
    bulk = run.bulk()
    assert bulk["code"] == "NOT_FOUND", bulk
    assert run.status()["status"]["bulk"]["closed"].get("unknown_session", 0) >= 1  # where it was refused


@pytest.mark.timeout(120)
def test_a_certificate_naming_only_localhost_is_refused_from_another_host(run):
    cert, key = make_cert(run.tmp / "cert-localhost", "DNS:localhost,IP:127.0.0.1")
    _, address = start_synchronizer(run.net, run.tmp / "sync-localhost", run.data, cert, key, 7090, 7091)
    # gRPC: the learner on host b trusts that certificate, and still refuses the server it names wrongly
    folder = run.tmp / "learner-1-localhost"
    learner = start_learner(run.net, "b", folder, run.data, address, 1, cert, TOKEN, "--connect-timeout", "2")
    err = refused(learner, folder)
    assert "198.18.0.1" in err and re.search(r"Hostname Verification Check failed", err), err[-3000:]
    status = run.client.ask(op="status", address=address, token=TOKEN, ca=str(cert))
    assert not status["ok"] and status["code"] == "UNAVAILABLE", status
    # the bulk socket plane: the handshake fails on the name check
    bulk = run.bulk(ca=cert, port=7091)
    assert bulk["code"] == "UNAVAILABLE" and "IP address mismatch" in bulk["error"], bulk


@pytest.mark.timeout(120)
def test_the_token_rule_off_loopback(run):
    folder = run.tmp / "learner-1-token"
    learner = start_learner(run.net, "b", folder, run.data, run.address, 1, run.cert, "not-the-token")
    err = refused(learner, folder)
    assert f"{run.address} refused registration: wrong or missing auth token" in err, err[-3000:]
    wrong = run.status(token="not-the-token")
    assert not wrong["ok"] and wrong["code"] == "UNAUTHENTICATED", wrong
    bulk = run.bulk(token="not-the-token")
    assert bulk["code"] == "UNAUTHENTICATED", bulk
    status = run.status()["status"]
    assert status["bulk"]["closed"].get("bad_token", 0) >= 1
    assert "1" not in status["books"] and 1 not in status["live"]  # never admitted
    assert run.wait_merged(0)["tokens_merged"] > 0  # the right token, from the same host: merged


@pytest.mark.timeout(120)
def test_bulk_socket_and_dashboard_at_the_advertised_address(run):
    run.wait_merged(0)
    assert learner_pushes_on_the_bulk_socket(run)  # learner 0, on host b, to the advertised bulk port
    # the dashboard, at the address the synchronizer printed, asked from host b
    url = urlsplit(run.board)
    assert url.hostname == run.net.address("sync") and url.port == BOARD_PORT, run.board
    assert url.scheme == "https"  # the run has TLS: so has its dashboard, with the same certificate
    state_url = f"{url.scheme}://{url.netloc}/state.json"
    board = run.client.ask(op="http", url=state_url, view=view_credential(TOKEN), ca=str(run.cert))
    assert board["code"] == 200, board
    rows = {r["id"]: r for r in board["body"]["learners"]}
    assert board["body"]["merges"] > 0 and rows[0]["tokens_merged"] > 0, board
    refused = run.client.ask(op="http", url=state_url, ca=str(run.cert))
    assert refused["code"] == 401, refused
    refused = run.client.ask(op="http", url=state_url, token=TOKEN, ca=str(run.cert))  # the control token
    assert refused["code"] == 401, refused


@pytest.mark.timeout(180)
def test_peer_recovery_across_hosts(run):
    wait_for(
        lambda: run.status()["status"]["learners"].get("0", {}).get("step", 0) >= 20, 120, 0.5, "learner 0 to train"
    )
    folder = run.tmp / "learner-2"  # empty: a new machine
    start_learner(run.net, "c", folder, run.data, run.address, 2, run.cert, TOKEN)
    log = folder / "stderr.log"
    took = wait_for(lambda: TOOK.search(log.read_text()), 120, 0.5, "the joiner on c to take a donated state")
    assert int(took.group(1)) == 0 and int(took.group(2)) > 0  # from the learner on host b
    donated = DONATED.findall((run.tmp / "learner-0" / "stderr.log").read_text())
    assert took.group(3) in donated  # exactly the moments the donor on b snapshotted
    wait_for(lambda: run.book(2).get("contributions", 0) >= 1, 90, 0.5, "the joiner's contributions")
    assert run.status()["status"]["donations"]["donated"] >= 1
