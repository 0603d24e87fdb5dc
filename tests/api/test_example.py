"""The "own model" example runs end to end as a user would run it, and its glue stays small."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "own_model.py"


@pytest.mark.parametrize("name", ["own_model.py", "hf_causal_lm.py"])
def test_glue_is_at_most_15_lines(name):
    glue = [line for line in (EXAMPLES / name).read_text().splitlines() if line.rstrip().endswith("# ddiloco")]
    assert 5 <= len(glue) <= 15, glue


def test_own_model_trains_exports_and_reloads(tmp_path, shakespeare):
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--tokens", "40000", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "learners exited [0, 0]" in out.stdout and "reloaded model equals the export: True" in out.stdout
    assert (tmp_path / "export" / "model.safetensors").is_file()


def test_hugging_face_llama_trains_exports_and_reloads_with_from_pretrained(tmp_path, shakespeare):
    pytest.importorskip("transformers", reason="the Hugging Face extra: pip install -e '.[hf]'")
    pytest.importorskip("datasets", reason="the Hugging Face extra: pip install -e '.[hf]'")
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "hf_causal_lm.py"), "--tokens", "60000", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "from_pretrained equals the export: True" in out.stdout
    assert (tmp_path / "export" / "config.json").is_file() and (tmp_path / "export" / "model.safetensors").is_file()


@pytest.mark.slow  # FSDP2 learners are in the default suite (tests/learner/test_fsdp.py), HF llama too (above)
@pytest.mark.timeout(300)
def test_hugging_face_llama_under_torchrun_with_fsdp2_learners(tmp_path, shakespeare):
    pytest.importorskip("transformers", reason="the Hugging Face extra: pip install -e '.[hf]'")
    pytest.importorskip("datasets", reason="the Hugging Face extra: pip install -e '.[hf]'")
    out = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "hf_causal_lm.py"),
            "--ranks",
            "2",
            "--tokens",
            "60000",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "learners exited [0, 0]" in out.stdout and "from_pretrained equals the export: True" in out.stdout
