"""CONTRIBUTING.md's coverage table states the floors CI enforces: the same part names and the same
floors as pyproject.toml's `[tool.ddiloco.coverage-floors]`, which `tools/coverage_parts.py --check`
reads."""

import re

import tomllib

from .conftest import REPO_ROOT


def contributing_floors() -> dict[str, int]:
    text = (REPO_ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("## Coverage", 1)[1]
    rows = re.findall(r"^\| *([^|]+?) *\|[^|]*\|[^|]*\|[^|]*\| *(\d+) *\|$", section, flags=re.M)
    return {name.strip("`"): int(floor) for name, floor in rows}


def test_contributings_coverage_table_has_pyprojects_floors():
    floors = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["ddiloco"]["coverage-floors"]
    assert contributing_floors() == floors
