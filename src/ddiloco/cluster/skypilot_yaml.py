"""A small YAML writer for the SkyPilot task files, so that writing them needs no YAML library.

Block style, for people to read and adapt: every one-line string is written double-quoted (JSON's
escaping is valid YAML there, so no value is ever read back as a number, a boolean or a null by
mistake), multi-line strings (the `run:` and `setup:` scripts) as literal blocks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

_PLAIN_KEY = re.compile(r"[A-Za-z_/][A-Za-z0-9_/.-]*")
Value = str | int | float | bool | None | Mapping[str, "Value"] | Sequence["Value"]


def _scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


def _block(text: str, indent: str) -> str:
    """A literal block scalar; `|` keeps the script's final newline, `|-` when it has none."""
    head = "|" if text.endswith("\n") else "|-"
    lines = text[:-1].split("\n") if text.endswith("\n") else text.split("\n")
    return head + "\n" + "\n".join(f"{indent}{line}" if line else "" for line in lines)


def _lines(value: object, indent: str) -> list[str]:
    out: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            name = str(key) if _PLAIN_KEY.fullmatch(str(key)) else json.dumps(str(key))
            out += _item(f"{indent}{name}:", item, indent)
    elif isinstance(value, list | tuple):
        for item in value:
            out += _item(f"{indent}-", item, indent)
    return out


def _item(head: str, item: object, indent: str) -> list[str]:
    if isinstance(item, str) and "\n" in item:
        return [f"{head} {_block(item, indent + '  ')}"]
    if isinstance(item, Mapping | list | tuple):
        if not item:
            return [f"{head} {'{}' if isinstance(item, Mapping) else '[]'}"]
        return [head, *_lines(item, indent + "  ")]
    return [f"{head} {_scalar(item)}"]


def dump(document: Mapping[str, object], comment: str = "") -> str:
    """`document` as YAML, with `comment` (one or more lines) as a header."""
    header = "".join(f"# {line}\n" if line else "#\n" for line in comment.splitlines())
    return header + "\n".join(_lines(document, "")) + "\n"
