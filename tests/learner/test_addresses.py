"""Address specs: host:port, or @FILE read again when a shard stops answering (a shard that moved)."""

from __future__ import annotations

import time

import pytest

from ddiloco.learner import addresses


def test_a_file_spec_resolves_to_the_address_in_it_and_rereads_only_a_new_valid_one(tmp_path):
    f = tmp_path / "address"
    f.write_text("127.0.0.1:7070\n")
    spec = f"@{f}"
    assert addresses.resolve(spec) == "127.0.0.1:7070"
    assert addresses.reread(spec, "127.0.0.1:7070") is None  # unchanged
    f.write_text("127.0.0.1:")  # half-written: never taken
    assert addresses.reread(spec, "127.0.0.1:7070") is None
    f.unlink()  # a restarting shard removed it: keep the last good address
    assert addresses.reread(spec, "127.0.0.1:7070") is None
    f.write_text("10.0.0.2:7171")
    assert addresses.reread(spec, "127.0.0.1:7070") == "10.0.0.2:7171"
    assert addresses.reread("127.0.0.1:7070", "127.0.0.1:7070") is None  # a fixed address never moves
    f.write_bytes(b"1" * (addresses.MAX_FILE_BYTES + 1))
    assert addresses.read_file(f) is None


def test_bad_specs_are_errors_that_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="@PATH"):
        addresses.check_spec("@")
    with pytest.raises(ValueError, match="host:port"):
        addresses.check_spec("nohost")
    addresses.check_spec(f"@{tmp_path / 'not-yet'}")  # may appear later
    with pytest.raises(ValueError, match="not-yet"):
        addresses.resolve(f"@{tmp_path / 'not-yet'}")


def test_waiting_for_address_files_is_bounded_and_sees_a_late_file(tmp_path):
    f = tmp_path / "address"
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="no synchronizer address"):
        addresses.wait_resolved([f"@{f}"], time.monotonic() + 0.5)
    assert time.monotonic() - start < 5.0
    f.write_text("127.0.0.1:9")
    assert addresses.wait_resolved(["127.0.0.1:1", f"@{f}"], time.monotonic() + 5) == ["127.0.0.1:1", "127.0.0.1:9"]
