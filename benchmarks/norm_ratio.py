"""How large honest outer gradients are against the bound `max_outer_norm_ratio` (default 10).

Trains the default GPT with Decoupled DiLoCo on the virtual clock and records, for every
contribution, its outer gradient's norm over max(the fragment's norm, 0.1 x sqrt(values)), the very
quantity the synchronizer bounds. The margin of the default is the bound over the largest ratio seen.

The inner optimizer is the library's default (Muon) unless `--inner-optimizer adamw`; each H's inner
lr is AdamW's (3e-3, and 4e-4 at H = 480) scaled by the ratio of the two defaults' lrs
(`train.inner.DEFAULT_LR`: Muon 0.012 against 3e-3). `benchmarks/results/norm-ratio.json` holds
AdamW's rows, `norm-ratio-muon.json` Muon's.

    python benchmarks/norm_ratio.py                  # H = 24, 96, 480; a few minutes on 2 cores
    python benchmarks/norm_ratio.py --inner-optimizer adamw --json
    python benchmarks/norm_ratio.py --quick --json   # H = 24 on fewer tokens
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ddiloco.core.checks import ContributionChecks
from ddiloco.core.config import AlgorithmConfig
from ddiloco.sim.config import SimConfig
from ddiloco.sim.run import run_sim
from ddiloco.train.inner import DEFAULT_LR, INNER_OPTIMIZERS, InnerConfig

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


def measure(h: int, lr: float, tokens: int, data: str, optimizer: str) -> dict:
    ratios: list[float] = []
    bound = ContributionChecks._too_large

    def recording(self, c, norms):  # noqa: ANN001, ANN202 - the checks' own signature
        plan, params = self.state.plan, self.state.params
        names = plan.names[c.fragment]
        grad = math.sqrt(sum(float(c.outer_gradient[n].double().square().sum()) for n in names))
        own = sum(float(params[n].double().square().sum()) for n in names)
        ratios.append(grad / math.sqrt(max(own, 1e-2 * plan.sizes[c.fragment])))
        return bound(self, c, norms)

    ContributionChecks._too_large = recording
    try:
        config = SimConfig(
            method="decoupled",
            learners=2,
            tokens=tokens,
            data=data,
            algorithm=AlgorithmConfig(fragments=min(24, h), sync_every=h, overlap=2),
            inner=InnerConfig(optimizer=optimizer, lr=lr),
        )
        result = run_sim(config)
    finally:
        ContributionChecks._too_large = bound
    limit = AlgorithmConfig().max_outer_norm_ratio
    return {
        "sync_every": h,
        "inner_optimizer": optimizer,
        "inner_lr": lr,
        "tokens": tokens,
        "contributions": len(ratios),
        "max_ratio": max(ratios),
        "median_ratio": sorted(ratios)[len(ratios) // 2],
        "bound": limit,
        "margin": limit / max(ratios),
        "rejected_contributions": result["rejected_contributions"],
        "eval_loss": result["eval_loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="end with one line of JSON")
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--inner-optimizer", choices=INNER_OPTIMIZERS, default=InnerConfig().optimizer)
    args = parser.parse_args()
    settings = (
        [(24, 3e-3, 100_000)] if args.quick else [(24, 3e-3, 300_000), (96, 3e-3, 400_000), (480, 4e-4, 1_000_000)]
    )
    scale = DEFAULT_LR[args.inner_optimizer] / DEFAULT_LR["adamw"]  # AdamW's lrs, in this optimizer's units
    rows = []
    for h, adamw_lr, tokens in settings:
        lr = float(f"{adamw_lr * scale:.6g}")
        row = measure(h, lr, tokens, args.data, args.inner_optimizer)
        rows.append(row)
        print(
            f"H={h:4d} {args.inner_optimizer} inner lr {lr:g}: largest ratio {row['max_ratio']:.3f} "
            f"(median {row['median_ratio']:.3f}) over {row['contributions']} contributions; "
            f"bound {row['bound']:g}, margin {row['margin']:.0f}x, rejected {row['rejected_contributions']}",
            flush=True,
        )
    if args.json:
        print(json.dumps({"rows": rows, "quick": args.quick}))


if __name__ == "__main__":
    main()
