"""Bandwidth: the bytes a real `ddiloco run` moves per learner per inner step, both ways, against a
ring all-reduce of the same model among 8 workers (in bf16 and in fp32), for bf16, int8 and int4
uploads, measured side by side in one run.

Each row is one real run (4 learners, the algorithm's defaults: P = H = 24, tau = 2) on the GPT of
--model-size: the three upload codecs with updates down in the default bf16, then updates down as
int8 / int4 differences from the version each learner holds (`--codec-down int8`, error feedback on
the synchronizer). `--codec-down X` runs the three upload codecs with X down only. The bytes are
counted by the synchronizer on its bulk streams (contributions in, updates out: every frame, with
its header); an inner step is one learner's step. A ring all-reduce sends and receives
2 (W - 1) / W of the model per worker per step.

A run's figure includes what every run pays once: a learner's join (nothing when it built the
initial model exactly as the synchronizer did: `wire.digest`, as here) and its final flush at the
end (each fragment's last partial work, pushed and merged). `--steady` also runs each pair at half
the budget and reports the bytes per step between the two runs (`*_steady`): what a run costs per
step once those are paid, and what a long run tends to (`--quick`'s runs of about 40 steps per
learner are too short for it to mean much).

    python benchmarks/bandwidth.py                 # ~8 minutes
    python benchmarks/bandwidth.py --quick --json  # a smaller model and budget, ~4 minutes
    python benchmarks/bandwidth.py --steady        # and each pair at half the budget, ~15 minutes
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table
from runs import ddiloco_run, parse_run_arguments

console = Console(stderr=True, width=150)
WORKERS = 8  # the all-reduce it is compared with


WITH_DIFFERENCES = [
    ("bf16", "bf16"),
    ("int8", "bf16"),
    ("int4", "bf16"),
    ("bf16", "int8"),
    ("int8", "int8"),
    ("int4", "int4"),
]


def run(codec: str, codec_down: str, args: argparse.Namespace, run_dir: Path, tokens: int) -> dict:
    flags = [
        "--learners",
        "4",
        "--model-size",
        args.model_size,
        "--data",
        str(args.data),
        "--tokens",
        str(tokens),
        "--codec",
        codec,
        "--codec-down",
        codec_down,
        "--seed",
        "0",
    ]
    console.print(f"[bold]{codec} up, {codec_down} down[/bold]: ddiloco run {' '.join(flags)}")
    return ddiloco_run(flags, run_dir, f"--codec {codec} --codec-down {codec_down}")


def between(whole: dict, half: dict) -> tuple[float, float]:
    """Bytes per step up and down between a run and one at half its budget: the one-offs cancel."""
    steps = whole["inner_steps"] - half["inner_steps"]
    if steps <= 0:
        raise SystemExit("the half-budget run took as many steps as the whole one: raise --tokens")
    return tuple(
        (whole[k] * whole["inner_steps"] - half[k] * half["inner_steps"]) / steps
        for k in ("bytes_up_per_step", "bytes_down_per_step")
    )


def ratios(ring: float, up: float, down: float) -> dict:
    return {"ratio_up": ring / up, "ratio_down": ring / down, "ratio_both_ways": 2 * ring / (up + down)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--codec-down",
        default=None,
        choices=("bf16", "fp32", "int8", "int4"),
        help="only this download codec (default: bf16, then int8 / int4 differences)",
    )
    p.add_argument("--steady", action="store_true", help="also run each pair at half the budget (see above)")
    args = parse_run_arguments(p, tokens=2_400_000)
    if args.quick:
        args.model_size, args.tokens = "tiny", 300_000
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        pairs = (
            WITH_DIFFERENCES if args.codec_down is None else [(c, args.codec_down) for c in ("bf16", "int8", "int4")]
        )
        for codec, codec_down in pairs:
            result = run(codec, codec_down, args, Path(tmp) / f"{codec}-{codec_down}", args.tokens)
            params = result["params"]
            up, down = result["bytes_up_per_step"], result["bytes_down_per_step"]
            ring = {dtype: 2 * (WORKERS - 1) / WORKERS * params * size for dtype, size in (("bf16", 2), ("fp32", 4))}
            row = {
                "codec": codec,
                "codec_down": codec_down,
                "params": int(params),
                "inner_steps": result["inner_steps"],
                "bytes_up_per_step": up,
                "bytes_down_per_step": down,
                # per contribution: what a codec does to one push, whatever the timing (pulls answered
                # early add pushes per step on a loaded machine)
                "bytes_up_per_contribution": up * result["inner_steps"] / max(1, result.get("contributions", 0)),
                # one update down, by form (a difference from the learner's version, or a whole value):
                # how many of each a run sends depends on timing, what one costs does not
                "bytes_per_update_difference": result.get("bytes_per_update_difference"),
                "bytes_per_update_whole": result.get("bytes_per_update_whole"),
                "difference_over_whole": result.get("difference_over_whole"),
                "allreduce_bf16_bytes_per_step": ring["bf16"],
                "allreduce_fp32_bytes_per_step": ring["fp32"],
                **ratios(ring["bf16"], up, down),
                "ratio_both_ways_fp32": 2 * ring["fp32"] / (up + down),
                "eval_loss": result.get("eval_loss"),
                "goodput": result.get("goodput"),
            }
            if args.steady:
                half = run(codec, codec_down, args, Path(tmp) / f"{codec}-{codec_down}-half", args.tokens // 2)
                up_s, down_s = between(result, half)
                row.update(
                    {
                        "bytes_up_per_step_steady": up_s,
                        "bytes_down_per_step_steady": down_s,
                        **{f"{k}_steady": v for k, v in ratios(ring["bf16"], up_s, down_s).items()},
                    }
                )
            rows.append(row)
    table = Table(
        title=f"bytes per learner per inner step vs a ring all-reduce among {WORKERS} workers "
        f"({rows[0]['params'] / 1e6:.2f}M parameters)"
    )
    for col in (
        "up codec",
        "down codec",
        "up B/step",
        "down B/step",
        "x fewer up",
        "x fewer down",
        "x fewer both (bf16 ring)",
        "x fewer both (fp32 ring)",
        "eval loss",
    ):
        table.add_column(col, justify="right")
    if args.steady:
        table.add_column("x fewer both, steady", justify="right")
    for r in rows:
        cells = [
            r["codec"],
            r["codec_down"],
            f"{r['bytes_up_per_step']:.0f}",
            f"{r['bytes_down_per_step']:.0f}",
            f"{r['ratio_up']:.1f}",
            f"{r['ratio_down']:.1f}",
            f"{r['ratio_both_ways']:.1f}",
            f"{r['ratio_both_ways_fp32']:.1f}",
            f"{r['eval_loss']:.4f}" if isinstance(r["eval_loss"], float) else "-",
        ]
        table.add_row(*cells, *([f"{r['ratio_both_ways_steady']:.1f}"] if args.steady else []))
    console.print(table)
    console.print("aims: >= 40x fewer both ways with the defaults (bf16), >= 100x with int4 uploads")
    if args.json:
        print(json.dumps({"rows": rows}, sort_keys=True))


if __name__ == "__main__":
    main()
