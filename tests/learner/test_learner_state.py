import time

import torch

from ddiloco.learner.journal import Journal, read_journals
from ddiloco.learner.state import BackgroundSaver, load_optimizer


def trained_adamw(steps=3):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(torch.randn(5, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_inner_optimizer_state_round_trips_through_the_background_saver(tmp_path):
    model, opt = trained_adamw()
    saver = BackgroundSaver(tmp_path / "inner")
    saver.submit(opt, inner_steps=3)
    saver.close()
    _, fresh = trained_adamw(steps=0)
    assert load_optimizer(tmp_path / "inner", fresh) == 3
    a, b = opt.state_dict(), fresh.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i, state in a["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["state"][i][key]), key


def test_missing_or_corrupt_state_is_ignored(tmp_path):
    _, opt = trained_adamw(steps=0)
    assert load_optimizer(tmp_path / "nothing", opt) is None
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "inner.json").write_text("{}")
    (tmp_path / "bad" / "inner.safetensors").write_bytes(b"not safetensors")
    assert load_optimizer(tmp_path / "bad", opt) is None


def test_journal_keeps_only_the_latest_record(tmp_path):
    j = Journal(tmp_path / "journal-a.json")
    j.write({"steps": 1, "tokens": 64, "note": "x" * 100})
    j.write({"steps": 2, "tokens": 128})
    [record] = list(read_journals(tmp_path, "journal-*.json"))  # readable without close (as after kill -9)
    assert record == {"steps": 2, "tokens": 128}
    j.close()


def test_the_saver_thread_survives_any_error_and_writes_the_next_state(tmp_path, monkeypatch, caplog):
    # #32's rule for background threads: safetensors raises its own error type (not OSError); the
    # writer must log it and write the next state, not die silently
    import ddiloco.learner.state as state

    real = state.save_optimizer
    failures = {"left": 1}

    def flaky(*args, **kwargs):
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("SafetensorError: too many open files")
        return real(*args, **kwargs)

    monkeypatch.setattr(state, "save_optimizer", flaky)
    _, opt = trained_adamw()
    saver = BackgroundSaver(tmp_path / "inner")
    saver.submit(opt, inner_steps=3)
    for _ in range(200):  # bounded: the failed write happens within a few milliseconds
        if failures["left"] == 0:
            break
        time.sleep(0.01)
    saver.submit(opt, inner_steps=4)
    saver.close()
    assert saver._thread.is_alive() is False and failures["left"] == 0
    _, fresh = trained_adamw(steps=0)
    assert load_optimizer(tmp_path / "inner", fresh) == 4
    assert "SafetensorError" in caplog.text
