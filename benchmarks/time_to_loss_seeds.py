"""benchmarks/time_to_loss.py across seeds: a scenario run once per seed, each seed against its own target
(its best baseline's final loss), summed up per method as mean +- standard deviation with every seed's
figure beside it. A method's run made beside other work (`quiet` False, after its reruns) is left out
of that method's means and named; a method that never reached the target in a kept seed has no mean
seconds (`reached` says in how many it did)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from rich.table import Table
from time_to_loss_show import console

Aim = Callable[[dict, "str | None"], "bool | None"]


def spread(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, sample standard deviation); the deviation is None below two values."""
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def method_row(method: str, per_seed: dict[int, dict]) -> dict:
    """One method's figures over the seeds (each seed's scenario result holds its row)."""
    rows = {s: next(r for r in result["rows"] if r["method"] == method) for s, result in per_seed.items()}
    kept = {s: r for s, r in rows.items() if r.get("quiet") is not False}
    batches = {r["eval_batches"] for r in rows.values()}
    if len(batches) > 1:
        raise ValueError(f"{method}: seeds evaluated on different validation batches {sorted(map(str, batches))}")
    seconds = {s: r["seconds_to_target"] for s, r in kept.items()}
    reached = [v for v in seconds.values() if v is not None]
    out: dict = {
        "method": method,
        "seeds": sorted(kept),
        "left_out": sorted(set(rows) - set(kept)),  # made beside other work, even after reruns
        "reached": len(reached),
        "seconds_to_target_per_seed": {str(s): v for s, v in sorted(seconds.items())},
        "eval_batches": batches.pop(),
    }
    mean, sd = spread(reached) if len(reached) == len(seconds) else (None, None)
    out.update(seconds_to_target=mean, seconds_to_target_sd=sd)
    for key in ("eval_loss", "goodput", "loss_at_first_finish", "finish_seconds", "sim_seconds_to_target"):
        if all(key not in r for r in rows.values()):  # sim figures, without --no-sim only
            continue
        values = {s: r.get(key) for s, r in kept.items()}
        mean, sd = spread([v for v in values.values() if v is not None])
        if any(v is None for v in values.values()):  # e.g. before its first evaluation, in one seed
            mean = sd = None
        out.update({key: mean, f"{key}_sd": sd, f"{key}_per_seed": {str(s): v for s, v in sorted(values.items())}})
    first = rows[min(rows)]
    out.update({k: first[k] for k in ("inner_lr", "outer_lr", "outer_momentum") if k in first})  # tuned once
    return out


def across_seeds(per_seed: dict[int, dict], methods: Sequence[str], baselines: Sequence[str], aim: Aim) -> dict:
    """A scenario's summary over its seeds: rows per method, the best baseline and synchronous rival
    by mean final loss, the aim judged on the mean seconds (a method that missed the target in any
    kept seed counts as never) and in each seed."""
    rows = [method_row(m, per_seed) for m in methods]
    by = {r["method"]: r for r in rows}
    finals = {m: by[m]["eval_loss"] for m in baselines if by[m].get("eval_loss") is not None}
    best = min(finals, key=lambda m: finals[m]) if finals else None
    rivals = {m: by[m]["eval_loss"] for m in ("diloco", "streaming") if m in by and by[m].get("eval_loss") is not None}
    seconds = {m: by[m]["seconds_to_target"] for m in by}
    targets = {str(s): r["target"] for s, r in sorted(per_seed.items())}
    return {
        "rows": rows,
        "seeds": sorted(per_seed),
        "target": statistics.fmean(targets.values()),
        "targets_per_seed": targets,
        "best_baseline": best,
        "best_synchronous": min(rivals, key=lambda m: rivals[m]) if rivals else None,
        "aim_met": aim(seconds, best),
        "aim_met_per_seed": {str(s): r["aim_met"] for s, r in sorted(per_seed.items())},
    }


def show_seeds(name: str, summary: dict, aim: str) -> None:
    """The table over seeds: mean +- sd, and each seed's seconds to its target."""
    seeds = summary["seeds"]
    t = Table(title=f"{name}: {len(seeds)} seeds {seeds}, each against its own target (mean {summary['target']:.4f})")
    for col in ("method", "s to target (mean +- sd)", "per seed", "eval loss", "goodput", "left out"):
        t.add_column(col, justify="right")

    def pm(mean: float | None, sd: float | None, fmt: str) -> str:
        if mean is None:
            return "never (some seed)"
        return fmt.format(mean) + ("" if sd is None else " +- " + fmt.format(sd))

    for r in summary["rows"]:
        per = " ".join("never" if v is None else f"{v:.1f}" for v in r["seconds_to_target_per_seed"].values())
        t.add_row(
            r["method"],
            pm(r["seconds_to_target"], r["seconds_to_target_sd"], "{:.1f}"),
            per,
            pm(r.get("eval_loss"), r.get("eval_loss_sd"), "{:.4f}"),
            pm(r.get("goodput"), r.get("goodput_sd"), "{:.3f}"),
            ",".join(map(str, r["left_out"])) or "-",
        )
    console.print(t)
    met = {True: "met", False: "NOT met", None: "-"}[summary["aim_met"]]
    per_seed = ", ".join(f"seed {s}: {v}" for s, v in summary["aim_met_per_seed"].items())
    console.print(f"aim ({aim}) on the means: {met}; {per_seed}")
