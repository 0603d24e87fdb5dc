"""tools/claims.py: the README's figures agree with their results files, and a changed figure fails."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _claims():
    spec = importlib.util.spec_from_file_location("claims", ROOT / "tools" / "claims.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["claims"] = module
    spec.loader.exec_module(module)
    return module


def test_the_readme_agrees_with_its_results_files(capsys):
    assert _claims().main([]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\d+ claims checked .*, 0 mismatches", out, re.M), out


def test_one_changed_figure_fails(tmp_path, capsys):
    readme = (ROOT / "README.md").read_text()
    figure = "goodput 26 % for data-parallel"
    assert figure in readme.replace("\n  ", " ")
    copy = tmp_path / "README.md"
    copy.write_text(readme.replace("goodput 26 %", "goodput 27 %", 1))
    assert _claims().main(["--readme", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH 'goodput {} % for data-parallel" in out and "['27'" in out, out


def test_a_figure_whose_text_is_gone_fails(tmp_path, capsys):
    copy = tmp_path / "README.md"
    copy.write_text((ROOT / "README.md").read_text().replace("for Decoupled DiLoCo with 2 / 4 / 8 / 16", "for 2-16"))
    assert _claims().main(["--readme", str(copy)]) == 1
    assert "NOT FOUND" in capsys.readouterr().out


def test_a_new_number_in_what_we_measured_fails(tmp_path, capsys):
    copy = tmp_path / "README.md"
    new = "\n- A new figure: 3.14 % faster.\n\n## Layout"
    copy.write_text((ROOT / "README.md").read_text().replace("\n## Layout", new))
    assert _claims().main(["--readme", str(copy), "--uncovered"]) == 1
    assert "UNCOVERED 3.14" in capsys.readouterr().out


def test_keys():
    lookup = _claims().lookup
    data = {
        "rows": [{"m": "a", "x": 1.0, "r": 20.0}, {"m": "b", "x": -3.0, "r": 5.0}, {"m": "c", "x": 2.0, "r": 20.0}],
        "s": {"a/b": {"k.1": [4, 5]}},
    }
    assert lookup(data, "rows[m=b].x") == -3.0
    assert lookup(data, "rows[1].m") == "b"
    assert lookup(data, "rows[0].r") == 20.0
    assert lookup(data, 's["a/b"]["k.1"][1]') == 5
    assert lookup(data, "rows[r=20].x@max") == 2.0
    assert lookup(data, "rows[m=a|b].x@min") == -3.0
    assert lookup(data, "rows[x<0]@count") == 1
    assert lookup(data, "rows[x>0]@count") == 2
    assert lookup(data, "rows[m=c].x / rows[m=a].x - 1") == 1.0
    assert lookup(data, "rows[m=c].x - rows[m=a].x") == 1.0
    assert lookup(data, "rows[m=c].x - 1") == 1.0
    with pytest.raises(ValueError, match="aggregate"):
        lookup(data, "rows[r=20].x")
    with pytest.raises(KeyError):
        lookup(data, "rows[m=z].x")
