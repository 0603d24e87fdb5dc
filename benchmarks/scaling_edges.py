"""The grid's edges in `scaling.py`: is a method's best grid point its best at all?

Almost every best point of the main grid sits on one of its edges: the smallest global batch (G = 8)
and the smallest outer lr (0.5). A best point on an edge says where the optimum is not, not where it
is. So at a few cheap (ratio, size) cells the grid is widened by one step past each of those edges
(`edges` in the benchmark's configuration: G = 4 for every method, outer lr 0.25 for the DiLoCo
family) and every method's best is taken again over the widened grid. The DiLoCo family stays at
data-parallel's best inner lr of the main grid, as in the main grid. Pure, on the result rows.
"""

from __future__ import annotations

from scaling_fit import METHODS


def _grid(cfg: dict, widened: bool) -> tuple[set, set, set]:
    """(inner lrs, outer lrs, global batches) of the main grid, or of the grid widened at the edges."""
    edges = cfg.get("edges") or {}
    inner, outer, batches = set(cfg["inner_lrs"]), set(cfg["outer_lrs"]), set(cfg["global_batches"])
    if widened:
        outer |= set(edges.get("outer_lrs", ()))
        batches |= set(edges.get("global_batches", ()))
    return inner, outer, batches


def _on(r: dict, grid: tuple[set, set, set]) -> bool:
    inner, outer, batches = grid
    lr_ok = r["inner_lr"] in inner if r["method"] == "ddp" else r["outer_lr"] in outer
    return lr_ok and r["global_batch"] in batches


def _points(method: str, grid: tuple[set, set, set]) -> int:
    inner, outer, batches = grid
    return (len(inner) if method == "ddp" else len(outer)) * len(batches)


def _best(runs: list[dict]) -> dict | None:
    if not runs:
        return None
    b = min(runs, key=lambda r: r["eval_loss"])
    return {
        "eval_loss": b["eval_loss"],
        "inner_lr": b["inner_lr"],
        "outer_lr": b["outer_lr"],
        "global_batch": b["global_batch"],
    }


def edge_report(rows: list[dict], cfg: dict) -> list[dict]:
    """Per probed cell and method (seed-0 runs): the best point on the main grid and on the widened
    grid, the loss change (widened / main - 1, never positive), whether the best moved past an edge,
    the gap to data-parallel's best on each grid, and whether the widened grid has all its points."""
    main, wide = _grid(cfg, False), _grid(cfg, True)
    out = []
    for ratio, size in (cfg.get("edges") or {}).get("cells", []):
        cell = [r for r in rows if r["ratio"] == ratio and r["size"] == size and r["seed"] == 0]
        ddp_main = _best([r for r in cell if r["method"] == "ddp" and _on(r, main)])
        if ddp_main is None:
            continue
        entries = []
        for method in METHODS:
            mine = [r for r in cell if r["method"] == method]
            if method != "ddp":  # the family's grid: at data-parallel's best inner lr of the main grid
                mine = [r for r in mine if r["inner_lr"] == ddp_main["inner_lr"]]
            on_main = [r for r in mine if _on(r, main)]
            on_wide = [r for r in mine if _on(r, wide)]
            best_main, best_wide = _best(on_main), _best(on_wide)
            if best_main is None or best_wide is None:
                continue
            entries.append(
                {
                    "ratio": ratio,
                    "size": size,
                    "method": method,
                    "main": best_main,
                    "widened": best_wide,
                    "change": best_wide["eval_loss"] / best_main["eval_loss"] - 1,
                    "moved": best_wide != best_main,
                    "complete": len({(r["inner_lr"], r["outer_lr"], r["global_batch"]) for r in on_wide})
                    == _points(method, wide),
                }
            )
        by = {e["method"]: e for e in entries}
        for e in entries:
            if "ddp" in by:
                e["gap_main"] = e["main"]["eval_loss"] / by["ddp"]["main"]["eval_loss"] - 1
                e["gap_widened"] = e["widened"]["eval_loss"] / by["ddp"]["widened"]["eval_loss"] - 1
        out += entries
    return out


def _point(p: dict) -> str:
    lr = f"lr {p['inner_lr']:g}" if p["outer_lr"] is None else f"outer {p['outer_lr']:g}"
    return f"{p['eval_loss']:.4f} ({lr}, G {p['global_batch']})"


def print_edges(table: list[dict], cfg: dict, say=print) -> None:  # noqa: ANN001
    if not table:
        return
    edges = cfg.get("edges") or {}
    say(
        f"Grid edges: the grid widened by G {edges.get('global_batches')} and outer lr {edges.get('outer_lrs')} "
        "at these cells (seed 0); best on the grid -> best on the widened grid"
    )
    for e in table:
        gaps = f"gap {100 * e['gap_main']:+.2f}% -> {100 * e['gap_widened']:+.2f}%" if "gap_main" in e else ""
        partial = "" if e["complete"] else "  (widened grid unfinished)"
        say(
            f"{e['ratio']:>4g} tok/param {e['size']:>5} {e['method']:<13} {_point(e['main'])} -> "
            f"{_point(e['widened'])} {100 * e['change']:+.2f}%  {gaps}{partial}"
        )
