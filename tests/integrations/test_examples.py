"""The examples as a user runs them from a fresh clone: `examples/` and `src/` copied into an empty
folder (no `../shared` beside it, no argument), each run to its end; their glue (lines ending in
`# ddiloco`) stays small; a learner that dies ends its example at once, naming the learner and its error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
FRAMEWORKS = {"hf_trainer.py", "accelerate_loop.py", "lightning_trainer.py"}

# (example, token budget, what its last line must say); budgets are as small as shows each one learning
RUNS = [
    ("own_model.py", 40_000, "reloaded model equals the export: True"),
    ("attach_optimizer.py", 60_000, "both learners' work merged: True"),
    ("hf_causal_lm.py", 60_000, "from_pretrained equals the export: True"),
    ("hf_trainer.py", 40_000, "both learners' work merged: True"),
    ("accelerate_loop.py", 40_000, "both learners' work merged: True"),
    ("lightning_trainer.py", 120_000, "both merged: True"),  # and its loss fell by 0.5 nats
]


def glue(name: str) -> list[str]:
    return [line for line in (EXAMPLES / name).read_text().splitlines() if line.rstrip().endswith("# ddiloco")]


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_a_frameworks_glue_is_at_most_5_lines(name):
    lines = glue(name)
    assert 2 <= len(lines) <= 5, lines
    assert any("import" in line for line in lines)  # the import counts as a line the user adds


def test_every_example_is_run_here():
    assert {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")} == {name for name, _, _ in RUNS}


@pytest.fixture(scope="module")
def bare_clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`examples/` and `src/` alone in an empty folder: what a user's clone has, without `../shared`."""
    root = tmp_path_factory.mktemp("bare") / "ddiloco"
    for part in ("examples", "src"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    assert not (root.parent / "shared").exists()
    return root


def run_example(clone: Path, *args: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(clone / "src")}  # the copy's package, not the installed one
    return subprocess.run([sys.executable, *args], cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("name", "tokens", "expect"), RUNS)
def test_example_runs_from_a_bare_clone(bare_clone, tmp_path, name, tokens, expect):
    out_dir = ["--out", str(tmp_path)] if "--out" in (EXAMPLES / name).read_text() else []
    out = run_example(bare_clone, f"examples/{name}", "--tokens", str(tokens), *out_dir)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert expect in out.stdout and "learners exited [0, 0]" in out.stdout
    assert (
        str(bare_clone / "src" / "ddiloco")
        in run_example(bare_clone, "-c", "import ddiloco; print(ddiloco.__file__)").stdout
    )  # it ran the copy


def test_a_missing_data_file_is_one_line(bare_clone, tmp_path):
    out = run_example(bare_clone, "examples/own_model.py", "--data", str(tmp_path / "nope.txt"), timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [f"--data: text corpus not found: {str(tmp_path / 'nope.txt')!r}"]


class _NeverEnds:
    """A run that never finishes on its own; records the stop the examples' launcher asks for."""

    def __init__(self) -> None:
        self.stopped: list[str] = []

    def wait(self, timeout: float | None = None) -> bool:
        time.sleep(min(timeout or 0.1, 0.1))
        return False

    def request_stop(self, reason: str = "") -> None:
        self.stopped.append(reason)

    def stop(self) -> None:
        self.stopped.append("stop")


def test_a_learner_that_dies_ends_the_example_at_once_naming_it_and_its_last_error(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from _launch import start_learners, wait_for_run

    crash = "import sys; print('RuntimeError: CUDA out of memory', file=sys.stderr); sys.exit(3)"
    wait = "import time; time.sleep(60)"
    learners = [*start_learners([sys.executable, "-c", crash, "--learner"], 1)]
    learners += start_learners([sys.executable, "-c", wait, "--learner"], 1)
    run = _NeverEnds()
    with pytest.raises(SystemExit) as ended:  # not the 120 s timeout, after which it would return
        wait_for_run(run, learners, timeout=120)
    assert str(ended.value) == "learner 0 exited with code 3 before the run ended: RuntimeError: CUDA out of memory"
    assert run.stopped == ["a learner failed", "stop"]
    assert all(lr.proc.poll() is not None for lr in learners)  # the other learner was ended too
