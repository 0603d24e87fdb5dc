"""The grid-edge probe of the scaling benchmark, on hand-made rows with hand-computed answers."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from scaling_edges import edge_report, print_edges  # noqa: E402

from .test_scaling import load, row  # noqa: E402

CFG = {
    "inner_lrs": [3e-3, 6e-3],
    "outer_lrs": [0.5, 1.0],
    "global_batches": [8, 16],
    "edges": {"cells": [[20.0, "a"]], "global_batches": [4], "outer_lrs": [0.25]},
}


def run(method, g, loss, lr=3e-3, olr=None, size="a", seed=0):  # noqa: ANN001
    return row(size, 1000, method, loss, seed=seed, lr=lr, olr=olr, batch=g)


def rows() -> list[dict]:
    """ddp: best 2.0 at lr 3e-3 G 8 on the grid, 1.9 at G 4 (6e-3) widened. diloco-m4 at ddp's inner
    lr: best 2.2 on the grid (outer 0.5, G 8), 2.1 at outer 0.25 G 8 widened; a run at another inner
    lr, a second seed and a run at another size would each change the answer if they were counted."""
    out = [run("ddp", g, 2.0 + 0.1 * (g == 16), lr=lr) for lr in (3e-3, 6e-3) for g in (8, 16)]
    out[2]["eval_loss"] = 2.05  # 6e-3 G 8: not the grid's best
    out += [run("ddp", 4, 1.95), run("ddp", 4, 1.9, lr=6e-3)]
    out += [
        run("diloco-m4", g, 2.2 + 0.1 * (olr > 0.5) + 0.05 * (g == 16), olr=olr) for olr in (0.5, 1.0) for g in (8, 16)
    ]
    out += [run("diloco-m4", g, 2.1 + 0.1 * (g != 8), olr=0.25) for g in (4, 8, 16)]
    out += [run("diloco-m4", 4, 2.3, olr=olr) for olr in (0.5, 1.0)]
    out.append(run("diloco-m4", 8, 1.0, lr=6e-3, olr=0.25))  # off ddp's inner lr: not counted
    out.append(run("diloco-m4", 8, 1.0, olr=0.25, seed=1))  # a second seed: not counted
    out.append(run("diloco-m4", 8, 1.0, olr=0.25, size="b"))  # not a probed cell
    return out


def test_the_widened_best_is_found_and_the_gaps_are_taken_on_each_grid():
    by = {e["method"]: e for e in edge_report(rows(), CFG)}
    assert set(by) == {"ddp", "diloco-m4"}
    ddp, m4 = by["ddp"], by["diloco-m4"]
    assert ddp["main"] == {"eval_loss": 2.0, "inner_lr": 3e-3, "outer_lr": None, "global_batch": 8}
    assert (ddp["widened"]["eval_loss"], ddp["widened"]["inner_lr"], ddp["widened"]["global_batch"]) == (1.9, 6e-3, 4)
    assert ddp["moved"] and ddp["change"] == pytest.approx(1.9 / 2.0 - 1) and ddp["complete"]
    assert (m4["main"]["outer_lr"], m4["main"]["global_batch"], m4["main"]["eval_loss"]) == (0.5, 8, 2.2)
    assert (m4["widened"]["outer_lr"], m4["widened"]["global_batch"]) == (0.25, 8)
    assert m4["widened"]["eval_loss"] == pytest.approx(2.1) and m4["complete"]
    assert m4["gap_main"] == pytest.approx(2.2 / 2.0 - 1) and m4["gap_widened"] == pytest.approx(2.1 / 1.9 - 1)


def test_an_unfinished_widened_grid_says_so_and_a_kept_best_did_not_move():
    kept = [r for r in rows() if not (r["method"] == "ddp" and r["global_batch"] == 4 and r["inner_lr"] == 6e-3)]
    for r in kept:
        if r["method"] == "ddp" and r["global_batch"] == 4:
            r["eval_loss"] = 2.5  # G 4 is worse: the grid's best stays
    ddp = next(e for e in edge_report(kept, CFG) if e["method"] == "ddp")
    assert not ddp["moved"] and ddp["change"] == 0.0 and not ddp["complete"]
    said: list[str] = []
    print_edges([ddp], CFG, said.append)
    assert "unfinished" in said[-1] and "2.0000 (lr 0.003, G 8) -> 2.0000 (lr 0.003, G 8)" in said[-1]


def test_load_prints_the_edges_and_keeps_them_out_of_the_main_table(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"rows": rows(), "config": CFG}))
    out, report = load(path)
    chosen = {c["method"]: c for c in report["chosen"] if c["size"] == "a"}
    assert chosen["ddp"]["global_batch"] == 8 and chosen["diloco-m4"]["outer_lr"] == 0.5  # the main grid only
    assert {e["method"] for e in report["edges"]} == {"ddp", "diloco-m4"}
    assert "Grid edges" in out.stdout and "2.2000 (outer 0.5, G 8) -> 2.1000 (outer 0.25, G 8)" in out.stdout
