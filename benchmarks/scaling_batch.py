"""The global-batch question of `scaling.py`: is DiLoCo's best global batch larger than data-parallel's?

When every method's optimum sits at the same grid point, "the best batch" cannot tell the methods apart,
but how fast each loses quality as G grows can: the paper's finding (DiLoCo tolerates a larger batch)
shows as a smaller penalty at the large-G end. Per (ratio, size, method): the loss at each G with the
method's learning rate tuned at that G, over its loss at its best G. Pure, on the result rows.
"""

from __future__ import annotations

import statistics

from scaling_fit import METHODS, choose


def batch_penalties(rows: list[dict]) -> list[dict]:
    """Per (ratio, method): the mean over sizes of loss(G) / loss(best G) - 1 for every G, the sizes
    it is taken over (those where every method of the ratio has run every G) and the best G at each size.
    Seed-0 runs; the DiLoCo family at data-parallel's chosen inner lr, as `choose` takes them."""
    ddp_lr = {(c["ratio"], c["size"]): c["inner_lr"] for c in choose(rows) if c["method"] == "ddp"}
    cells: dict[tuple, dict[int, float]] = {}
    first = min((r["seed"] for r in rows), default=0)
    for r in rows:
        if r["seed"] != first:
            continue
        if r["method"] != "ddp" and r["inner_lr"] != ddp_lr.get((r["ratio"], r["size"])):
            continue
        by_g = cells.setdefault((r["ratio"], r["size"], r["method"]), {})
        by_g[r["global_batch"]] = min(by_g.get(r["global_batch"], float("inf")), r["eval_loss"])
    grid = sorted({g for by_g in cells.values() for g in by_g})
    out = []
    for ratio in sorted({k[0] for k in cells}, reverse=True):
        methods = [m for m in METHODS if any(k[0] == ratio and k[2] == m for k in cells)]
        # the sizes where every method has every G: the methods are compared over the same sizes
        common = {
            size
            for (r, size, _) in cells
            if r == ratio and all(all(g in cells.get((ratio, size, m), {}) for g in grid) for m in methods)
        }
        for method in methods:
            full = {k[1]: v for k, v in cells.items() if k[0] == ratio and k[2] == method and k[1] in common}
            penalty = (
                {g: statistics.fmean(by_g[g] / min(by_g.values()) - 1 for by_g in full.values()) for g in grid}
                if full
                else {}
            )
            out.append(
                {
                    "ratio": ratio,
                    "method": method,
                    "sizes": sorted(full, key=lambda s: min(r["params"] for r in rows if r["size"] == s)),
                    "penalty": {str(g): p for g, p in penalty.items()},
                    "best_global_batch": {size: min(by_g, key=by_g.__getitem__) for size, by_g in full.items()},
                }
            )
    return out


def print_batches(table: list[dict], say=print) -> None:  # noqa: ANN001
    say("Global batch: loss at G (lr tuned at that G) / loss at the best G - 1, mean over the sizes listed")
    for t in table:
        if not t["penalty"]:
            continue
        by_g = sorted(t["penalty"].items(), key=lambda item: int(item[0]))
        cols = "  ".join(f"G {g:>3}: {100 * p:+6.2f}%" for g, p in by_g)
        best = ", ".join(f"{s} {t['best_global_batch'][s]}" for s in t["sizes"])
        say(f"{t['ratio']:>4g} tok/param {t['method']:<13} {cols}   best G by size: {best}")
