"""Line and branch coverage per part of the package, from the `.coverage` file a `pytest --cov` run left.

    python tools/coverage_parts.py            # the table; parts under 80 % are named
    python tools/coverage_parts.py --check    # and exit 1 if a part fell below its floor
    python tools/coverage_parts.py --markdown # the table for CONTRIBUTING.md ("## Coverage")

The floors are `[tool.ddiloco.coverage-floors]` in pyproject.toml: each part's figure when it was set,
rounded down, less one point for the spread between runs (paths that depend on timing, such as
retries, are not taken in every run), so that no part's coverage falls without someone deciding it may.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import coverage

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "ddiloco"
TARGET = 80.0


def part_of(path: str) -> str:
    """`src/ddiloco/wire/framing.py` -> `wire`; the package's top-level modules -> `(top)`."""
    rel = Path(path).resolve().relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else "(top)"


def per_part(data_file: Path) -> dict[str, dict[str, int]]:
    """Statements and branches, covered and in all, summed over each part's files."""
    cov = coverage.Coverage(data_file=str(data_file))
    cov.load()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "coverage.json"
        cov.json_report(outfile=str(out), include=[str(PACKAGE / "*")])
        files = json.loads(out.read_text())["files"]
    parts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for path, info in files.items():
        s, p = info["summary"], parts[part_of(path)]
        p["lines"] += s["num_statements"]
        p["lines_hit"] += s["covered_lines"]
        p["branches"] += s.get("num_branches", 0)
        p["branches_hit"] += s.get("covered_branches", 0)
    return {k: dict(v) for k, v in sorted(parts.items())}


def percent(hit: int, total: int) -> float:
    return 100.0 * hit / total if total else 100.0


def markdown(parts: dict[str, dict[str, int]], floors: dict[str, int]) -> str:
    """CONTRIBUTING.md's table: each part's lines, line and branch coverage, and its floor."""
    rows = ["| part | lines | line % | branch % | floor |", "|---|---:|---:|---:|---:|"]
    for name, p in parts.items():
        lines, branches = percent(p["lines_hit"], p["lines"]), percent(p["branches_hit"], p["branches"])
        rows.append(f"| {name} | {p['lines']} | {lines:.1f} | {branches:.1f} | {floors.get(name, '-')} |")
    total_hit, total = sum(p["lines_hit"] for p in parts.values()), sum(p["lines"] for p in parts.values())
    rows.append(f"| all | {total} | {percent(total_hit, total):.1f} | | {floors.get('all', '-')} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-file", type=Path, default=ROOT / ".coverage")
    parser.add_argument("--check", action="store_true", help="exit 1 if a part is below its floor")
    parser.add_argument("--markdown", action="store_true", help="print the table as CONTRIBUTING.md has it")
    args = parser.parse_args()
    if not args.data_file.exists():
        parser.error(f"{args.data_file}: no coverage data; run `python -m pytest --cov` first")
    floors = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ddiloco"]["coverage-floors"]
    parts = per_part(args.data_file)
    if args.markdown:
        print(markdown(parts, floors))
        return 0
    print(f"{'part':<14}{'lines':>8}{'line %':>9}{'branches':>10}{'branch %':>10}{'floor':>8}")
    below, fallen = [], []
    for name, p in parts.items():
        lines, branches = percent(p["lines_hit"], p["lines"]), percent(p["branches_hit"], p["branches"])
        floor = floors.get(name)
        shown = "-" if floor is None else floor
        print(f"{name:<14}{p['lines']:>8}{lines:>8.1f}%{p['branches']:>10}{branches:>9.1f}%{shown:>8}")
        if lines < TARGET:
            below.append(name)
        if floor is not None and lines < floor:
            fallen.append(f"{name} {lines:.1f} % < floor {floor}")
    total_hit, total = sum(p["lines_hit"] for p in parts.values()), sum(p["lines"] for p in parts.values())
    overall = percent(total_hit, total)
    print(f"{'all':<14}{total:>8}{overall:>8.1f}%{'':>19}{floors.get('all', '-'):>8}")
    if "all" in floors and overall < floors["all"]:
        fallen.append(f"all {overall:.1f} % < floor {floors['all']}")
    print(f"parts under {TARGET:.0f} % of lines: {', '.join(below) or 'none'}")
    missing = sorted(set(parts) - set(floors))
    if args.check and (fallen or missing):
        for line in fallen:
            print(f"coverage fell: {line}", file=sys.stderr)
        for name in missing:
            print(f"part {name} has no floor in [tool.ddiloco.coverage-floors]", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
