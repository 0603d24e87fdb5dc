"""One CLI language (issue 13, item 6): every flag says what it is for, a flag spelled the same in two
commands means the same thing with the same default, and `--threads` follows one rule."""

from __future__ import annotations

import typer.main

from ddiloco.cli import _register, app, options

_register()


def commands() -> dict:
    group = typer.main.get_command(app)
    return dict(group.commands)  # type: ignore[attr-defined]


def options_of(command) -> list:  # noqa: ANN001 - typer carries its own copy of click's classes
    return [p for p in command.params if p.param_type_name == "option" and not getattr(p, "hidden", False)]


def test_every_flag_of_every_command_has_help():
    missing = [
        f"{name} {o.opts[0]}"
        for name, command in commands().items()
        for o in options_of(command)
        if not (o.help or "").strip()
    ]
    assert not missing, f"flags without help: {missing}"


# Flags whose default rightly differs per command.
PER_COMMAND = {
    "--dashboard",  # on for `ddiloco run`, opt-in for a service started by hand
    "--tokens",  # the simulator and the demo need a budget; the runtime may run by --duration instead
    "--learners",  # `ddiloco goodput` takes a list of M to compare
    "--step-time",  # goodput: the paper's cluster step; sim: one virtual-clock step
    "--reconfigure-seconds",  # 5 steps in both: goodput's steps are 2 s, the simulator's 1 s
    "--codec",  # real learners send bf16; the simulator is exact unless asked (its quality rows compare exactly)
    "--overlap",  # runs choose tau from the measured link (auto); the goodput model has no link to measure
    # the same unit everywhere; 0 in run and learner: no emulation, the real link as it is; the simulator
    # has no real link, so it models one site's (10 ms, 1000 MB/s)
    "--net-latency",
    "--net-bandwidth",
}


def test_a_flag_has_one_default_everywhere():
    seen: dict[str, dict[str, object]] = {}
    for name, command in commands().items():
        for o in options_of(command):
            if o.opts[0] not in PER_COMMAND:
                seen.setdefault(o.opts[0], {})[name] = o.default
    differing = {flag: by for flag, by in seen.items() if len({repr(v) for v in by.values()}) > 1}
    assert not differing, f"same flag, different defaults: {differing}"


def test_threads_zero_means_automatic_everywhere(monkeypatch):
    for name in ("sim", "run", "synchronizer", "learner"):
        (threads,) = [o for o in options_of(commands()[name]) if o.opts[0] == "--threads"]
        assert threads.default == 0, name
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert options.shared_threads(0, 5) == 3 and options.shared_threads(0, 40) == 1
    assert options.shared_threads(2, 40) == 2
