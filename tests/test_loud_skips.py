"""CI's rule for skips (tests/conftest.py): a skip whose reason is on `.ci/run`'s list passes, any other
fails the run."""

import os
import subprocess
import sys
from pathlib import Path

from .conftest import REPO_ROOT, allowed_skips, unallowed


def test_allowed_skips_are_matched_by_their_reason_and_others_are_named():
    allowed = allowed_skips("needs CUDA | no GPU in CI\n\n  torchtitan not importable | its own venv\n")
    assert allowed == ["needs CUDA", "torchtitan not importable"]
    skips = [("a::t", "needs CUDA"), ("b::t", "needs Chromium (apt-get install chromium)")]
    assert unallowed(skips, allowed) == [("b::t", "needs Chromium (apt-get install chromium)")]


def test_a_skip_off_the_list_fails_a_ci_run_and_one_on_it_does_not(tmp_path: Path):
    test = tmp_path / "test_skips.py"
    test.write_text("import pytest\n\ndef test_a():\n    pytest.skip('needs a missing tool')\n")
    (tmp_path / "conftest.py").write_text((REPO_ROOT / "tests" / "conftest.py").read_text())
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "DDILOCO_ALLOWED_SKIPS")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:cov", str(test)]

    def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    assert run(base).returncode == 0  # outside CI a skip is a skip
    failed = run({**base, "CI": "true"})
    assert failed.returncode == 1 and "test_skips.py::test_a" in failed.stdout
    assert "needs a missing tool" in failed.stdout
    allowed = run({**base, "CI": "true", "DDILOCO_ALLOWED_SKIPS": "missing tool | not in CI\n"})
    assert allowed.returncode == 0, allowed.stdout[-2000:]
    # a module that skips whole at import is a skip too
    test.write_text("import pytest\n\npytest.importorskip('no_such_module_here', reason='needs a missing tool')\n")
    assert run({**base, "CI": "true"}).returncode == 1
    allowed_env = {**base, "CI": "true", "DDILOCO_ALLOWED_SKIPS": "missing tool | not in CI\n"}
    assert run(allowed_env).returncode == 5  # pytest's own "no test ran", not the rule's failure
