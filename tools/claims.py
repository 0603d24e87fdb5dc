"""Hold every figure the README states about a measurement against the results file it comes from.

    python tools/claims.py                 # check README.md against tools/claims.toml; exit 1 on any miss
    python tools/claims.py --uncovered     # list the numbers in "## What we measured" that no claim covers
    python tools/claims.py --readme COPY   # check another copy of the README (the test does this)

Each `[[claim]]` in tools/claims.toml is:

    text   = "goodput {} % for data-parallel"    # README text, {} per figure (spaces, quote marks normalised)
    file   = "benchmarks/results/goodput-calibration.json"
    keys   = ["results[method=ddp,chips=1200000].goodput"]   # one per {}
    scale  = 100          # optional: multiply before rounding (default 1); a list gives one per {}
    digits = 0            # optional: decimals (default 3); a list gives one per {}
    unchecked = "why"     # instead of file/keys: the text holds its numbers literally; the figure has no
                          # committed results file (say why); the text must still be found
    setting = "what"      # the same for numbers that are not measurements (a configuration, a version)

A key is a path into the JSON: `a.b.c` (dict keys), `a[2]` (a list index), `a["k.with.dots"]` (a dict
key that has dots or slashes), and `rows[method=decoupled,link=wan]` (the items of a list whose fields
equal those values; alternatives with `|`: `size=84k|148k`; also `field<0`, `field>0`). A selector that
matches one item continues from it; one that matches several continues on each, and the path must then
end in an aggregate: `@min`, `@max`, `@mean`, `@count` (an aggregate also takes one match, or none
for `@count`). A key may also be `A / B` (a ratio), `A / B - 1`
(a relative difference) or `A - B`, A and B paths (B may be a number: `A - 1`). `abs = true` takes the absolute value.

A figure matches when the README shows exactly the value formatted with its digits. A number in the
"What we measured" section that no claim's text covers (a claim, an unchecked figure or a setting) is a
failure too, so that a new figure cannot go in unchecked; `--uncovered` lists them with their context.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## What we measured"
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*")
_SEGMENT = re.compile(r'\.?(?:([^.\[\]@]+)|\[(\d+)\]|\["([^"]+)"\]|\[([^\]]+)\])|@(min|max|mean|count)')


def _norm(text: str) -> str:
    return " ".join(text.split())


def _match(item: Any, conditions: str) -> bool:
    if not isinstance(item, dict):
        return False
    for cond in conditions.split(","):
        m = re.fullmatch(r"\s*([^=<>]+?)\s*([=<>])\s*(.+?)\s*", cond)
        if not m:
            raise ValueError(f"bad selector condition {cond!r}")
        field, op, want = m.groups()
        have = item.get(field)
        if op in "<>":
            if not isinstance(have, (int, float)) or not (have < float(want) if op == "<" else have > float(want)):
                return False
        elif not any(_equal(have, alt) for alt in want.split("|")):
            return False
    return True


def _equal(have: Any, want: str) -> bool:
    if isinstance(have, bool) or not isinstance(have, (int, float)):
        return str(have) == want
    try:
        return float(want) == have
    except ValueError:
        return False


def lookup(data: Any, path: str) -> Any:
    """The value at `path` in `data` (see the module's docstring); a ratio `A / B` or `A / B - 1`."""
    m = re.fullmatch(r"(.+?)\s+/\s+(.+?)(\s+-\s+1)?", path.strip())
    if m:
        ratio = lookup(data, m.group(1)) / lookup(data, m.group(2))
        return ratio - 1 if m.group(3) else ratio
    m = re.fullmatch(r"(.+?)\s+-\s+(.+?)", path.strip())
    if m:
        right = m.group(2)
        return lookup(data, m.group(1)) - (float(right) if re.fullmatch(r"[\d.]+", right) else lookup(data, right))
    values, many, pos = [data], False, 0
    while pos < len(path):
        seg = _SEGMENT.match(path, pos)
        if not seg or seg.end() == pos:
            raise ValueError(f"bad key {path!r} at {path[pos:]!r}")
        pos = seg.end()
        key, index, quoted, selector, agg = seg.groups()
        if agg:
            if agg == "count":
                values = [len(values)]
            else:
                if not values:
                    raise ValueError(f"{path!r}: nothing to aggregate")
                nums = [float(v) for v in values]
                values = [{"min": min, "max": max}[agg](nums) if agg != "mean" else sum(nums) / len(nums)]
            many = False
        elif selector is not None:
            values = [x for v in values for x in v if _match(x, selector)]
            if not values and "@" not in path:
                raise KeyError(f"{path!r}: [{selector}] matches nothing")
            many = many or len(values) != 1
        elif index is not None:
            values = [v[int(index)] for v in values]
        else:
            values = [v[quoted if quoted is not None else key] for v in values]
    if many:
        raise ValueError(f"{path!r}: the selector matches {len(values)} items; end the key in an aggregate")
    return values[0]


def _format(value: float, digits: int) -> str:
    text = f"{value:.{digits}f}"
    return "0" if text in ("-0", "-0.0") and digits == 0 else text


def check(readme: Path, table: Path) -> tuple[int, list[str], list[str], int]:
    """(figures checked against a file, problems, uncovered numbers, unchecked): one line per problem."""
    flat = _norm(re.sub(r"(?m)^>[ \t]?", "", readme.read_text()))  # a quote's lines read as one text
    claims = tomllib.loads(table.read_text())["claim"]
    problems: list[str] = []
    spans: list[tuple[int, int]] = []
    unchecked = 0
    cache: dict[str, Any] = {}
    for claim in claims:
        pattern = _norm(claim["text"])
        if "setting" in claim or "unchecked" in claim:
            unchecked += "unchecked" in claim
            expected = pattern
            where = f"unchecked: {claim['unchecked']}" if "unchecked" in claim else f"setting: {claim['setting']}"
        else:
            keys = claim["keys"]
            digits = claim.get("digits", 3)
            digits = digits if isinstance(digits, list) else [digits] * len(keys)
            scale = claim.get("scale", 1)
            scale = scale if isinstance(scale, list) else [scale] * len(keys)
            path = claim["file"]
            try:
                if path not in cache:
                    cache[path] = json.loads((ROOT / path).read_text())
                values = []
                for key, d, k in zip(keys, digits, scale, strict=True):
                    value = lookup(cache[path], key) * k
                    values.append(_format(abs(value) if claim.get("abs") else value, d))
            except (OSError, KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
                problems.append(f"BROKEN {pattern!r}: {exc} (file {path}, keys {keys})")
                continue
            expected = pattern.format(*values)
            where = f"file {path}, keys {', '.join(keys)}"
        at = flat.find(expected)
        if at >= 0:
            spans.append((at, at + len(expected)))
            continue
        regex = re.escape(pattern).replace(re.escape("{}"), r"(\S+?)") if "{}" in pattern else None
        found = re.search(regex, flat) if regex else None
        if found:
            said = list(found.groups())
            problems.append(f"MISMATCH {pattern!r}: README says {said}, expected {expected!r} ({where})")
            spans.append(found.span())
        else:
            problems.append(f"NOT FOUND {pattern!r}: expected {expected!r} ({where})")
    start = flat.find(SECTION)
    end = flat.find(" ## ", start + len(SECTION)) if start >= 0 else -1
    uncovered = []
    if start >= 0:
        for m in NUMBER.finditer(flat, start + len(SECTION), end if end >= 0 else len(flat)):
            if not any(a <= m.start() and m.end() <= b for a, b in spans):
                uncovered.append(f"{m.group()}  …{flat[max(m.start() - 40, 0) : m.end() + 20]}…")
    checked = sum("keys" in claim for claim in claims)
    return checked, problems, uncovered, unchecked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--table", type=Path, default=ROOT / "tools" / "claims.toml")
    parser.add_argument("--uncovered", action="store_true", help="list the numbers that no claim covers")
    args = parser.parse_args(argv)
    n, problems, uncovered, unchecked = check(args.readme, args.table)
    for line in problems:
        print(line)
    for line in uncovered if args.uncovered else []:
        print(f"UNCOVERED {line}")
    print(
        f"{n} claims checked against their results files, {unchecked} unchecked (no results file: tools/claims.toml "
        f"says why), {len(problems)} mismatches, "
        f"{len(uncovered)} numbers in {SECTION!r} no claim covers" + (" (--uncovered lists them)" if uncovered else "")
    )
    return 1 if problems or uncovered else 0


if __name__ == "__main__":
    sys.exit(main())
