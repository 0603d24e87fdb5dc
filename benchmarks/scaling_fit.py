"""The fits and tables of `scaling.py`: chosen settings per (ratio, size, method), loss(N) as a power law
per method, and the relative gap to data-parallel with its trend and where a fit would put parity.

Pure numpy on the result rows, so `--load` and the tests need no training.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

METHODS = ("ddp", "diloco-m1", "diloco-m2", "diloco-m4", "decoupled-m4")
# two-sided 95 % Student-t quantiles by degrees of freedom (no scipy needed)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def t95(df: int) -> float:
    return T95.get(df, 1.96 if df > 30 else 2.2)


def line_fit(x: np.ndarray | list[float], y: np.ndarray | list[float]) -> dict:
    """Least squares y = intercept + slope * x, with the slope's and intercept's standard errors
    (None with fewer than three points: no residual degrees of freedom)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    xm, ym = x.mean(), y.mean()
    sxx = float(((x - xm) ** 2).sum())
    slope = float(((x - xm) * (y - ym)).sum() / sxx)
    intercept = float(ym - slope * xm)
    resid = y - (intercept + slope * x)
    se = icpt_se = None
    if n > 2:
        s2 = float((resid**2).sum()) / (n - 2)
        se = math.sqrt(s2 / sxx)
        icpt_se = math.sqrt(s2 * (1 / n + xm**2 / sxx))
    return {"n": n, "slope": slope, "intercept": intercept, "slope_se": se, "intercept_se": icpt_se}


def fit_power_law(params: list[float], losses: list[float]) -> dict:
    """loss = A * N^-alpha, least squares on log-log; alpha's standard error from the slope's."""
    f = line_fit(np.log(params), np.log(losses))
    return {"alpha": -f["slope"], "alpha_se": f["slope_se"], "A": math.exp(f["intercept"]), "n": f["n"]}


def gap_trend(params: list[float], ratios: list[float], boot: int = 2000, seed: int = 0) -> dict:
    """Trend of loss_method / loss_ddp with N: log ratio = c + beta * log10 N (beta: change of the log
    ratio per 10x parameters; the ratio of two power laws is a power law). Parity is where the line
    crosses 0: N* = 10^(-c / beta), with a residual bootstrap interval. The verdict says whether the
    fit can say: the slope's 95 % interval must exclude 0 and point toward parity."""
    x, y = np.log10(np.asarray(params, float)), np.log(np.asarray(ratios, float))
    f = line_fit(x, y)
    beta, se, c = f["slope"], f["slope_se"], f["intercept"]
    out = {"n": f["n"], "beta_per_decade": beta, "beta_se": se, "parity_params": None, "parity_log10_ci90": None}
    if se is None:
        out["verdict"] = "too few sizes to fit a trend"
        return out
    half = t95(f["n"] - 2) * se
    out["beta_ci95"] = [beta - half, beta + half]
    mean_gap = float(y.mean())
    if beta - half <= 0 <= beta + half:
        out["verdict"] = "the fit cannot say: the trend's 95 % interval includes no trend"
        return out
    if beta * mean_gap > 0:
        out["verdict"] = "the gap moves away from parity with size (95 %)"
        return out
    out["parity_params"] = 10 ** (-c / beta)
    rng = np.random.default_rng(seed)
    fitted = c + beta * x
    resid = y - fitted
    roots = []
    for _ in range(boot):
        b = line_fit(x, fitted + rng.choice(resid, size=len(resid), replace=True))
        if b["slope"] * mean_gap < 0:  # the resampled trend still points toward parity
            roots.append(-b["intercept"] / b["slope"])
    out["parity_share_of_bootstrap"] = len(roots) / boot
    if roots:
        out["parity_log10_ci90"] = [float(np.percentile(roots, 5)), float(np.percentile(roots, 95))]
    out["verdict"] = "the gap closes with size (95 %)"
    return out


def key(row: dict) -> tuple:
    return (row["ratio"], row["size"], row["method"])


def _best_seed0(runs: list[dict]) -> dict:
    """The lowest-loss run among those of the first seed."""
    first = min(r["seed"] for r in runs)
    return min((r for r in runs if r["seed"] == first), key=lambda r: r["eval_loss"])


def choose(rows: list[dict]) -> list[dict]:
    """Per (ratio, size, method): the grid point with the lowest seed-0 eval loss, and its loss as the
    mean over every seed run at that point. The DiLoCo family's grid is at data-parallel's best inner lr
    (scaling.py's rule): its runs at another inner lr (made before a wider data-parallel grid moved that
    best) are not part of the grid and are left out; a cell left with none is not reported yet."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault(key(r), []).append(r)
    ddp_lr = {k[:2]: _best_seed0(runs)["inner_lr"] for k, runs in cells.items() if k[2] == "ddp"}
    out = []
    for (ratio, size, method), every in cells.items():
        runs = [r for r in every if method == "ddp" or r["inner_lr"] == ddp_lr.get((ratio, size), r["inner_lr"])]
        if not runs:
            continue
        first = [r for r in runs if r["seed"] == min(x["seed"] for x in runs)]
        best = min(first, key=lambda r: r["eval_loss"])
        point = (best["inner_lr"], best["outer_lr"], best["global_batch"])
        at = [r for r in runs if (r["inner_lr"], r["outer_lr"], r["global_batch"]) == point]
        losses = [r["eval_loss"] for r in at]
        out.append(
            {
                "ratio": ratio,
                "size": size,
                "params": best["params"],
                "tokens": best["tokens"],
                "method": method,
                "inner_lr": best["inner_lr"],
                "outer_lr": best["outer_lr"],
                "global_batch": best["global_batch"],
                "per_learner_batch": best["per_learner_batch"],
                "grid_points": len(first),
                "seeds": len(losses),
                "eval_loss": statistics.fmean(losses),
                "eval_loss_seed0": best["eval_loss"],
                "eval_loss_std": statistics.stdev(losses) if len(losses) > 1 else 0.0,
            }
        )
    ddp = {(c["ratio"], c["size"]): c["eval_loss"] for c in out if c["method"] == "ddp"}
    for c in out:
        if (c["ratio"], c["size"]) in ddp:
            c["gap_vs_ddp"] = c["eval_loss"] / ddp[(c["ratio"], c["size"])] - 1
    order = {m: i for i, m in enumerate(METHODS)}
    return sorted(out, key=lambda c: (-c["ratio"], c["params"], order.get(c["method"], 9)))


def fits(chosen: list[dict]) -> list[dict]:
    """Per ratio and method: the power law of loss(N) and (not for ddp) the gap's trend. A cell whose
    grid is not complete is left out: one marked `complete: false` (scaling.py's bracketing not done),
    or, where no cell is marked (a file from before the bracketing), one with fewer points than the
    fullest cell (a run still going)."""
    out = []
    full = max((c["grid_points"] for c in chosen), default=0)
    done = {key(c) for c in chosen if c.get("complete", c["grid_points"] == full)}
    for ratio in sorted({c["ratio"] for c in chosen}, reverse=True):
        at = [c for c in chosen if c["ratio"] == ratio]
        for method in [m for m in METHODS if any(c["method"] == m for c in at)]:
            mine = [c for c in at if c["method"] == method]
            cells = sorted((c for c in mine if key(c) in done), key=lambda c: c["params"])
            entry: dict = {"ratio": ratio, "method": method, "sizes": len(cells), "incomplete": len(mine) - len(cells)}
            if len(cells) >= 2:
                entry["power_law"] = fit_power_law([c["params"] for c in cells], [c["eval_loss"] for c in cells])
            gaps = [c for c in cells if "gap_vs_ddp" in c and (ratio, c["size"], "ddp") in done]
            if method != "ddp" and len(gaps) >= 2:
                entry["gap_trend"] = gap_trend([c["params"] for c in gaps], [1 + c["gap_vs_ddp"] for c in gaps])
            out.append(entry)
    return out


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_report(chosen: list[dict], fitted: list[dict], say=print) -> None:  # noqa: ANN001
    """The table (chosen settings, loss, gap to ddp) and the fits, as plain text."""
    say("Loss at each size, best grid point per method (mean over seeds at that point); gap = loss / ddp - 1")
    say(
        f"{'tok/param':>9} {'size':>6} {'params':>9} {'tokens':>10} {'method':<13} {'inner lr':>8} "
        f"{'outer lr':>8} {'G':>4} {'B/lrn':>5} {'grid':>4} {'seeds':>5} {'eval loss':>16} {'gap':>8}"
    )
    for c in chosen:
        spread = f"±{c['eval_loss_std']:.4f}" if c["seeds"] > 1 else ""
        gap = f"{100 * c['gap_vs_ddp']:+.2f}%" if "gap_vs_ddp" in c else ""
        say(
            f"{c['ratio']:>9g} {c['size']:>6} {c['params']:>9,} {c['tokens']:>10,} {c['method']:<13} "
            f"{c['inner_lr']:>8g} {_fmt(c['outer_lr'], 'g'):>8} {c['global_batch']:>4} {c['per_learner_batch']:>5} "
            f"{c['grid_points']:>4} {c['seeds']:>5} {c['eval_loss']:>8.4f}{spread:>8} {gap:>8}"
        )
    say("")
    say("Fits: loss = A * N^-alpha (log-log least squares, ± standard error); gap trend: log(loss/ddp) per 10x N")
    for f in fitted:
        p = f.get("power_law")
        law = (
            f"alpha {p['alpha']:.4f} ± {_fmt(p['alpha_se'], '.4f')}, A {p['A']:.3f}"
            if p
            else "fewer than 2 sizes: no fit"
        )
        partial = f" ({f['incomplete']} with an unfinished grid left out)" if f.get("incomplete") else ""
        line = f"{f['ratio']:>4g} tok/param {f['method']:<13} {f['sizes']} sizes{partial}: {law}"
        g = f.get("gap_trend")
        if g:
            se = _fmt(g["beta_se"] and 100 * g["beta_se"], ".2f")
            line += f"; gap trend {100 * g['beta_per_decade']:+.2f}%/decade ± {se}"
            if g.get("parity_params"):
                ci = g["parity_log10_ci90"]
                band = f" (90 % bootstrap: 10^{ci[0]:.1f}..10^{ci[1]:.1f})" if ci else ""
                line += f"; parity at N ≈ {g['parity_params']:.3g}{band}"
            line += f"; {g['verdict']}"
        say(line)
