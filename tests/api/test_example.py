"""The examples' glue stays small; the HF example under torchrun with FSDP2 learners (slow). Every example
runs from a bare clone in tests/integrations/test_examples.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["own_model.py", "hf_causal_lm.py"])
def test_glue_is_at_most_15_lines(name):
    glue = [line for line in (EXAMPLES / name).read_text().splitlines() if line.rstrip().endswith("# ddiloco")]
    assert 5 <= len(glue) <= 15, glue


@pytest.mark.slow  # FSDP2 learners are in the default suite (tests/learner/test_fsdp.py), HF llama too (above)
@pytest.mark.timeout(300)
def test_hugging_face_llama_under_torchrun_with_fsdp2_learners(tmp_path):
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
