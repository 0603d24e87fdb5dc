"""The layout's rules, checked by walking every import in the package (docs/architecture.md).

Arrows point down: cli -> launch, sim, goodput -> synchronizer, learner -> wire -> core. `core` imports
nothing of the rest, `wire` neither side, the two sides not each other; no module imports itself
back through others, not even inside a function or under TYPE_CHECKING; every part says what it is.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import ddiloco

PACKAGE = Path(ddiloco.__file__).parent

# part -> the parts it may import (besides itself).
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "records": set(),
    "chaos": set(),
    "train": set(),
    "wire": {"core"},
    "synchronizer": {"wire", "core", "records"},
    "learner": {"wire", "core", "records", "train"},
    "sim": {"core", "train", "chaos", "records", "wire"},  # wire: the codecs outer gradients go through
    "goodput": {"chaos"},
    "launch": {"synchronizer", "learner", "wire", "core", "records", "train", "chaos"},
    "api": {"synchronizer", "learner", "wire", "core", "records", "train"},
    "report": {"records"},
    "cluster": {"launch", "records", "wire"},  # the Slurm backend: the same commands `launch` runs locally
    "dataparallel": {"launch", "learner", "records", "train", "chaos"},  # launch's processes, a learner's journal
    "hosts": set(),  # network namespaces, links and processes on them: plain Linux, nothing of ours
    "integrations": {"learner"},  # the frameworks' hooks on a learner's client: HF, Lightning, torchtitan
    # `ddiloco run`'s backends, behind one door: they drive the local supervisor (launch), the cluster
    # schedulers (cluster), the data-parallel baselines and a network of hosts; a room of their own
    # because cluster and dataparallel already sit on launch (launch importing them would point up)
    "backends": {
        "launch",
        "cluster",
        "dataparallel",
        "hosts",
        "api",  # the shards' Status and Stop while a Slurm run is followed
        "learner",  # a Slurm run's availability, from the learners' journals
        "records",
        "train",
        "chaos",
        "wire",
    },
    "cli": {
        "api",
        "backends",
        "cluster",
        "dataparallel",
        "launch",
        "sim",
        "goodput",
        "report",
        "synchronizer",
        "learner",
        "wire",
        "core",
        "records",
        "train",
        "chaos",
        "hosts",  # ddiloco run --network hosts
    },
}
TOP_LEVEL_MODULES = {"ddiloco", "ddiloco.__main__", "ddiloco.version"}
# top-level modules that import nothing of ours, which any part may name; the package itself (its
# public surface, which reaches every part) is not one of them: a part importing it points up
LEAVES = {"ddiloco.version"}
MAX_LINES = 600  # catches a file that holds several concepts (docs/architecture.md)
# A command parses its flags into a config and hands that to the part that acts on it (`ddiloco run`:
# to a backend, `backends/`): no function of `cli` runs longer than this, `ddiloco run` itself shorter.
MAX_CLI_FUNCTION_LINES = 80
MAX_RUN_COMMAND_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path) -> set[str]:
    """Every ddiloco module that `name` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("ddiloco"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("ddiloco"):
                continue
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def part_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and module not in TOP_LEVEL_MODULES else None


def test_every_module_belongs_to_a_known_part():
    unknown = {m for m in MODULES if m not in TOP_LEVEL_MODULES and part_of(m) not in ALLOWED}
    assert not unknown, f"modules outside the parts named in ALLOWED: {sorted(unknown)}"


def test_parts_import_only_downwards():
    wrong = []
    for module, targets in GRAPH.items():
        part = part_of(module)
        if part is None:
            continue
        for target in targets:
            other = part_of(target)
            if (
                other is None
                and target not in LEAVES
                or other is not None
                and other != part
                and other not in ALLOWED[part]
            ):
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))


def test_the_leaves_import_nothing_of_ours():
    for leaf in LEAVES:
        assert not GRAPH[leaf], f"{leaf} imports {sorted(GRAPH[leaf])}: any part may import it, so it may import none"


def test_core_and_wire_stay_pure_of_the_sides():
    for module, targets in GRAPH.items():
        if part_of(module) == "core":
            assert all(part_of(t) == "core" for t in targets), (module, targets)
        if part_of(module) == "wire":
            assert not {part_of(t) for t in targets} & {"synchronizer", "learner", "launch"}, (module, targets)


def test_no_import_cycles():
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(GRAPH[m]):
            if state.get(t) == 1:
                return stack[stack.index(t) :] + [t]
            if t not in state:
                cycle = visit(t)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def function_lengths(part: str) -> dict[str, int]:
    """Every function of `part` (nested ones too): its lines from its `def` to its last line, both
    counted (its signature and docstring in, its decorators out)."""
    out = {}
    for module, path in MODULES.items():
        if part_of(module) == part:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    assert node.end_lineno is not None
                    out[f"{module}.{node.name}:{node.lineno}"] = node.end_lineno - node.lineno + 1
    return out


def test_cli_functions_are_short():
    lengths = function_lengths("cli")
    long = {name: n for name, n in lengths.items() if n > MAX_CLI_FUNCTION_LINES}
    assert not long, f"functions in cli/ over {MAX_CLI_FUNCTION_LINES} lines (build a config, hand it over): {long}"
    (run,) = [n for name, n in lengths.items() if name.startswith("ddiloco.cli.run.run:")]
    assert run <= MAX_RUN_COMMAND_LINES, f"ddiloco run's command is {run} lines (at most {MAX_RUN_COMMAND_LINES})"


def test_modules_are_small():
    big = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines (one concept per file: move out the others): {big}"


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_every_part_says_what_it_is(part):
    doc = importlib.import_module(f"ddiloco.{part}").__doc__
    assert doc and len(doc.split()) >= 8, f"ddiloco/{part}/__init__.py needs a docstring saying what the part is"
