"""The "own model" example runs end to end as a user would run it, and its glue stays small."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_model.py"


def test_glue_is_at_most_15_lines():
    glue = [line for line in EXAMPLE.read_text().splitlines() if line.rstrip().endswith("# ddiloco")]
    assert 5 <= len(glue) <= 15, glue


def test_own_model_trains_exports_and_reloads(tmp_path, shakespeare):
    out = subprocess.run([sys.executable, str(EXAMPLE), "--tokens", "40000", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "learners exited [0, 0]" in out.stdout and "reloaded model equals the export: True" in out.stdout
    assert (tmp_path / "export" / "model.safetensors").is_file()
