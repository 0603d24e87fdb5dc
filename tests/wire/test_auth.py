import pytest

from ddiloco.wire import auth


@pytest.mark.parametrize(
    "host, loop",
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("", False),
        ("10.1.2.3", False),
    ],
)
def test_loopback_detection(host, loop):
    assert auth.is_loopback(host) is loop


def test_a_token_is_required_beyond_loopback():
    auth.require_token_policy("127.0.0.1", None, False)
    auth.require_token_policy("0.0.0.0", "s3cret", False)
    auth.require_token_policy("0.0.0.0", None, True)
    with pytest.raises(ValueError, match="shared secret"):
        auth.require_token_policy("0.0.0.0", None, False)


def test_token_comparison_and_environment(monkeypatch):
    assert auth.token_matches("abc", "abc") and not auth.token_matches("abc", "abd")
    assert not auth.token_matches("abc", None)
    monkeypatch.setenv(auth.TOKEN_ENV, "from-env")
    assert auth.resolve_token(None) == "from-env" and auth.resolve_token("flag") == "flag"


def test_tls_needs_both_files(tmp_path):
    with pytest.raises(ValueError, match="both"):
        auth.server_credentials(tmp_path / "cert.pem", None)
    assert auth.server_credentials(None, None) is None


def _self_signed(tmp_path, names="DNS:localhost,IP:127.0.0.1"):
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl not available to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            f"subjectAltName={names}",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.mark.timeout(60)
def test_tls_with_token_end_to_end(tiny_task, tmp_path):
    from ddiloco.core import AlgorithmConfig
    from ddiloco.learner.client import LearnerClient
    from ddiloco.synchronizer.server import SynchronizerServer, build_service
    from ddiloco.synchronizer.settings import ServiceSettings

    from ..support.runtime import FAST

    cert, key = _self_signed(tmp_path)
    params = {n: p.detach() for n, p in tiny_task.build_model(0).named_parameters()}
    service = build_service(params, AlgorithmConfig(fragments=2, sync_every=4), ServiceSettings(timeouts=FAST))
    server = SynchronizerServer(service, "127.0.0.1", 0, "tok", auth.server_credentials(cert, key))
    address = server.start()
    try:
        ok = LearnerClient(
            tiny_task.build_model(1), address, 0, token="tok", timeouts=FAST, credentials=auth.channel_credentials(cert)
        )
        assert ok.start() == 0 and ok.core.versions == [0, 0]
        ok.close()
        plain = LearnerClient(tiny_task.build_model(1), address, 1, token="tok", timeouts=FAST, start_timeout=2)
        with pytest.raises(ConnectionError):  # no TLS: the handshake never completes
            plain.start()
        plain.close()
    finally:
        server.stop(grace=0.2)


@pytest.mark.timeout(60)
def test_a_certificate_that_does_not_name_the_address_is_named_in_the_learners_error(tiny_task, tmp_path):
    """#46: a TLS name mismatch ended the learner with "is it running, and is the address right?".
    Its one line now names the mismatch and the certificate's subjectAltName. (example.invalid is
    never resolved: the learner connects to 127.0.0.1, which the certificate does not name.)"""
    from ddiloco.core import AlgorithmConfig
    from ddiloco.learner.client import LearnerClient
    from ddiloco.synchronizer.server import SynchronizerServer, build_service
    from ddiloco.synchronizer.settings import ServiceSettings

    from ..support.runtime import FAST

    cert, key = _self_signed(tmp_path, "DNS:example.invalid,DNS:*.example.invalid")
    params = {n: p.detach() for n, p in tiny_task.build_model(0).named_parameters()}
    service = build_service(params, AlgorithmConfig(fragments=2, sync_every=4), ServiceSettings(timeouts=FAST))
    server = SynchronizerServer(service, "127.0.0.1", 0, "tok", auth.server_credentials(cert, key))
    address = server.start()
    try:
        credentials = auth.channel_credentials(cert)
        assert auth.tls_mismatch(address, credentials) is not None
        learner = LearnerClient(
            tiny_task.build_model(1), address, 0, token="tok", timeouts=FAST, credentials=credentials, start_timeout=2
        )
        with pytest.raises(ConnectionError) as failed:
            learner.start()
        learner.close()
        line = str(failed.value)
        assert "TLS name mismatch" in line and "DNS:example.invalid, DNS:*.example.invalid" in line, line
        assert "'127.0.0.1'" in line and "is it running" not in line
    finally:
        server.stop(grace=0.2)


def test_subject_alt_names_match_as_tls_matches_them():
    assert auth._name_matches("127.0.0.1", "IP Address", "127.0.0.1")
    assert not auth._name_matches("127.0.0.2", "IP Address", "127.0.0.1")
    assert auth._name_matches("Host.Example.org", "DNS", "host.example.org")
    assert auth._name_matches("a.example.org", "DNS", "*.example.org")
    assert not auth._name_matches("a.b.example.org", "DNS", "*.example.org")
    assert not auth._name_matches("127.0.0.1", "DNS", "localhost")
