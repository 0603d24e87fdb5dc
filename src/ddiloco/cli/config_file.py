"""One CLI language: old flag spellings kept as hidden aliases, and `--config FILE.toml` for every command.

The same idea has the same flag in every command (`--sync-every`, `--overlap`, `--learner-mtbf`,
`--learner-down`, `--chaos-trace`, `--event-log`, `--step-time`, `--reconfigure-seconds`). Spellings
that earlier releases used still work (they are rewritten before parsing, and not shown in --help).

`--config run.toml` reads the command's settings from a TOML file, keys spelled like the flags
(`sync-every = 12` or `sync_every = 12`); flags given on the command line override it. An unknown
key is an error that names it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

ALIASES: dict[str, dict[str, str]] = {
    "goodput": {
        "--inner-steps": "--sync-every",
        "--tau": "--overlap",
        "--reconfig-seconds": "--reconfigure-seconds",
        "--step-seconds": "--step-time",
    },
    "sim": {
        "--fail-mtbf": "--learner-mtbf",
        "--fail-downtime": "--learner-down",
        "--failures": "--chaos-trace",
        "--failures-scale": "--chaos-trace-scale",
        "--events": "--event-log",
    },
    "learner": {"--checkpoint-every": "--save-state-every"},  # the others' --checkpoint-every counts merges
}

#: Spellings that earlier releases used for a setting whose unit has changed since: refused, naming the
#: new flag and its unit (an alias would read the old number in the new unit).
RENAMED: dict[str, dict[str, str]] = {
    "sim": {
        "--latency": "--net-latency, in milliseconds (as ddiloco run's)",
        "--bandwidth": "--net-bandwidth, in MB/s (as ddiloco run's)",
    },
}


def _command_index(args: list[str]) -> int | None:
    for i, token in enumerate(args):
        if not token.startswith("-"):
            return i
    return None


def apply_aliases(args: list[str]) -> list[str]:
    i = _command_index(args)
    if i is None or args[i] not in ALIASES:
        return args  # (a command in RENAMED is in ALIASES too)
    table, out = ALIASES[args[i]], list(args[: i + 1])
    renamed = RENAMED.get(args[i], {})
    for j, token in enumerate(args[i + 1 :], start=i + 1):
        if token == "--":
            return out + args[j:]
        name, eq, value = token.partition("=")
        if name in renamed:
            raise ValueError(f"{name} is now {renamed[name]}")
        out.append(table.get(name, name) + eq + value if name in table else token)
    return out


def _load_toml(path: Path) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ValueError("--config needs Python 3.11, or the tomli package on Python 3.10") from None
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ValueError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"--config {path}: not valid TOML ({exc})") from None


def split_config(args: list[str], app: typer.Typer) -> tuple[list[str], dict | None]:
    """Take `--config FILE` out of the arguments; the file's settings as click's default_map."""
    i = _command_index(args)
    if i is None:
        return args, None
    path, rest = None, list(args[: i + 1])
    j = i + 1
    while j < len(args):
        token = args[j]
        if token == "--config":
            if j + 1 >= len(args):
                raise ValueError("--config needs a file")
            path, j = Path(args[j + 1]), j + 2
            continue
        if token.startswith("--config="):
            path = Path(token.split("=", 1)[1])
        else:
            rest.append(token)
        j += 1
    if path is None:
        return args, None
    command = typer.main.get_command(app).commands.get(args[i])  # type: ignore[attr-defined]
    if command is None:
        return rest, None  # click reports the unknown command
    by_flag = {
        opt.lstrip("-"): p.name for p in command.params for opt in getattr(p, "opts", []) if opt.startswith("--")
    }
    aliases = {old.lstrip("-"): new.lstrip("-") for old, new in ALIASES.get(args[i], {}).items()}
    settings = {}
    for key, value in _load_toml(path).items():
        flag = key.replace("_", "-")
        flag = aliases.get(flag, flag)
        if flag not in by_flag or flag == "config":
            raise ValueError(
                f"--config {path}: unknown setting {key!r} for `ddiloco {args[i]}` (see `ddiloco {args[i]} --help`)"
            )
        settings[by_flag[flag]] = value
    return rest, {args[i]: settings}
