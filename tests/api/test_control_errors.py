"""`stop_run`, `shard_status`, `fetch_global` and the export helpers when something is wrong: a bad
address, a wrong token, a shard that does not answer, a folder without a checkpoint, a bad --out or
--hf-config (real gRPC on loopback)."""

from __future__ import annotations

import json
import socket
from contextlib import contextmanager

import pytest
import torch
from safetensors.torch import load_file

from ddiloco.api.control import shard_status, stop_run
from ddiloco.api.export import WEIGHTS, export_global, fetch_global, load_global, shard_dirs
from ddiloco.core import AlgorithmConfig, SynchronizerCore, plan_for_model
from ddiloco.synchronizer.checkpoint import CheckpointStore
from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire.timeouts import Timeouts

pytestmark = pytest.mark.timeout(60)

TOKEN = "s3cret-token"
FAST = Timeouts.derive(0.1)


def small_params():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@contextmanager
def shards(count=1, token=TOKEN):
    """`count` shards of a small MLP on loopback, with an auth token; yields their addresses, the
    model's parameters and the services."""
    params = small_params()
    servers, services = [], []
    try:
        for shard in range(count):
            service = build_service(
                params,
                AlgorithmConfig(fragments=2, sync_every=4, overlap=1),
                ServiceSettings(shard=shard, num_shards=count, timeouts=FAST, tokens=10**9),
            )
            server = SynchronizerServer(service, "127.0.0.1", 0, token)
            servers.append(server)
            services.append(service)
            server.start()
        yield [s.address for s in servers], params, services
    finally:
        for server in servers:
            server.stop(grace=0.2)


def closed_port_address() -> str:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", "host name:80", "http://x:1"])
def test_a_malformed_address_is_refused_before_any_connection(address):
    with pytest.raises(ValueError, match="bad synchronizer address"):
        stop_run(address, TOKEN)
    with pytest.raises(ValueError, match="bad synchronizer address"):
        shard_status(address, TOKEN)


def test_a_wrong_token_is_a_connection_error_naming_the_shard_and_the_run_goes_on():
    with shards() as (addresses, _, (service,)):
        (address,) = addresses
        with pytest.raises(ConnectionError, match=rf"synchronizer {address} did not stop the run \(UNAUTHENTICATED"):
            stop_run(address, "wrong-token", timeout=5.0)
        with pytest.raises(ConnectionError, match=rf"synchronizer {address} did not answer Status \(UNAUTHENTICATED\)"):
            shard_status(address, "wrong-token", timeout=5.0)
        assert not service.stopping  # the refused Stop changed nothing
        status = shard_status(address, TOKEN, timeout=5.0)
        assert isinstance(status, dict) and status


def test_a_shard_that_does_not_answer_is_named_and_the_shards_before_it_were_stopped():
    dead = closed_port_address()
    with shards() as (addresses, _, (service,)):
        (address,) = addresses
        with pytest.raises(ConnectionError, match=rf"synchronizer {dead} did not stop the run \(UNAVAILABLE"):
            stop_run(f"{address}, {dead}", TOKEN, reason="operator", timeout=5.0)
        assert service.stopping and service.stop_reason == "operator"
    with pytest.raises(ConnectionError, match=rf"synchronizer {dead} did not answer Status \(UNAVAILABLE\)"):
        shard_status(dead, TOKEN, timeout=5.0)


def test_stop_run_takes_a_comma_separated_list_and_returns_every_shard_that_acknowledged():
    with shards(2) as (addresses, _, services):
        assert stop_run(" , ".join(addresses), TOKEN, timeout=5.0) == addresses
        assert all(s.stopping and s.stop_reason == "stop requested" for s in services)


def test_fetch_global_from_a_shard_that_does_not_answer_is_a_connection_error_naming_the_shards():
    dead = closed_port_address()
    with pytest.raises(ConnectionError, match=rf"a synchronizer of \['{dead}'\] did not answer the fetch"):
        fetch_global(dead, TOKEN, timeout=5.0)


def test_fetch_global_with_a_wrong_token_is_refused_and_with_the_right_one_gives_every_shards_fragments():
    with shards(2) as (addresses, params, _):
        with pytest.raises(ConnectionError, match="did not answer the fetch"):
            fetch_global(addresses, "wrong-token", timeout=5.0)
        got = fetch_global(",".join(addresses), TOKEN, timeout=5.0)
    assert set(got) == set(params)
    assert all(torch.equal(got[n], params[n]) for n in params)


def save_run(run_dir, num_shards=2):
    """A run folder with one checkpoint per shard (sync-0/, sync-1/), each holding its own fragments."""
    params = small_params()
    config = AlgorithmConfig(fragments=2, sync_every=4, overlap=1)
    plan = plan_for_model(params, 2)
    for shard in range(num_shards):
        core = SynchronizerCore(config, plan, params, owned=frozenset({shard}))
        CheckpointStore(run_dir / f"sync-{shard}").save(core, {"signature": "x"}, {})
    return params


def test_a_folder_without_a_checkpoint_is_refused_naming_it(tmp_path):
    (tmp_path / "sync-0").mkdir()  # a shard folder that never checkpointed
    with pytest.raises(ValueError, match=rf"{tmp_path} holds no synchronizer checkpoint"):
        shard_dirs(tmp_path)
    with pytest.raises(ValueError, match="holds no synchronizer checkpoint"):
        load_global(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="holds no synchronizer checkpoint"):
        export_global(tmp_path, out)
    assert not out.exists()  # nothing written


def test_shard_dirs_takes_a_run_folder_or_one_checkpoint_folder(tmp_path):
    save_run(tmp_path)
    assert shard_dirs(tmp_path) == [tmp_path / "sync-0", tmp_path / "sync-1"]
    assert shard_dirs(tmp_path / "sync-1") == [tmp_path / "sync-1"]


def test_an_out_that_cannot_be_created_is_refused_naming_it(tmp_path):
    save_run(tmp_path / "run")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match=rf"--out {blocker}/model: cannot create it"):
        export_global(tmp_path / "run", blocker / "model")


def test_a_missing_hf_config_is_refused_naming_it(tmp_path):
    save_run(tmp_path / "run")
    missing = tmp_path / "nowhere"
    missing.mkdir()
    with pytest.raises(ValueError, match=rf"--hf-config {missing}: no config.json there"):
        export_global(tmp_path / "run", tmp_path / "out", hf_config=missing)
    with pytest.raises(ValueError, match="no config.json there"):
        export_global(tmp_path / "run", tmp_path / "out", hf_config=missing / "config.json")
    odd = tmp_path / "odd"
    (odd / "config.json").mkdir(parents=True)  # a folder named config.json is no config
    with pytest.raises(ValueError, match=rf"--hf-config {odd}: no config.json there"):
        export_global(tmp_path / "run", tmp_path / "out", hf_config=odd)


def test_export_writes_every_shards_parameters_and_the_hf_config_from_a_folder_a_file_or_an_object(tmp_path):
    params = save_run(tmp_path / "run")
    config_dir = tmp_path / "hf"
    config_dir.mkdir()
    (config_dir / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    for i, hf_config in enumerate([config_dir, config_dir / "config.json"]):
        out = tmp_path / f"out{i}"
        weights = export_global(tmp_path / "run", out, hf_config=hf_config)
        assert weights == out / WEIGHTS
        saved = load_file(str(weights))
        assert set(saved) == set(params) and all(torch.equal(saved[n], params[n]) for n in params)
        assert json.loads((out / "config.json").read_text()) == {"model_type": "tiny"}

    class Config:
        def save_pretrained(self, folder):
            (tmp_path / "saved_to").write_text(folder)

    out = tmp_path / "out-object"
    export_global(tmp_path / "run", out, hf_config=Config())
    assert (tmp_path / "saved_to").read_text() == str(out)


def test_exporting_into_the_hf_config_folder_keeps_its_config(tmp_path):
    save_run(tmp_path / "run")
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "tiny"}')
    export_global(tmp_path / "run", out, hf_config=out)  # the same file: not copied onto itself
    assert (out / "config.json").read_text() == '{"model_type": "tiny"}'
    assert (out / WEIGHTS).is_file()
