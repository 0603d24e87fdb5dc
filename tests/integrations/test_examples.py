"""The integration examples: their glue (lines ending in `# ddiloco`, counted as tests/api/test_example.py
counts them) stays at most 5 lines, and each runs end to end as a user would run it (slow)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NEEDS = {"hf_trainer.py": "transformers", "accelerate_loop.py": "accelerate", "lightning_trainer.py": "lightning"}


def glue(name: str) -> list[str]:
    return [line for line in (EXAMPLES / name).read_text().splitlines() if line.rstrip().endswith("# ddiloco")]


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_glue_is_at_most_5_lines(name):
    lines = glue(name)
    assert 2 <= len(lines) <= 5, lines
    assert any("import" in line for line in lines)  # the import counts as a line the user adds


@pytest.mark.slow  # the same paths run in the default suite: test_transformers, test_accelerate, test_lightning
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("name", "tokens", "expect"),
    [
        ("hf_trainer.py", 40_000, "both learners' work merged: True"),
        ("accelerate_loop.py", 40_000, "both learners' work merged: True"),
        ("lightning_trainer.py", 120_000, "both merged: True"),  # and its loss fell by 0.5 nats
    ],
)
def test_example_runs_end_to_end(name, tokens, expect, shakespeare):
    pytest.importorskip(NEEDS[name], reason=f"{NEEDS[name]} is an optional extra (pyproject.toml)")
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--tokens", str(tokens)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert expect in out.stdout and "learners exited [0, 0]" in out.stdout
