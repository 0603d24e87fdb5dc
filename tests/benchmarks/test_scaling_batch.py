"""The global-batch table of the scaling benchmark, on hand-made rows with hand-computed penalties."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from scaling_batch import batch_penalties, print_batches  # noqa: E402

from .test_scaling import row  # noqa: E402


def run(size, params, method, g, loss, lr=3e-3, olr=None, seed=0):  # noqa: ANN001
    return row(size, params, method, loss, seed=seed, lr=lr, olr=olr, batch=g)


def rows() -> list[dict]:
    """Two sizes. ddp: best at G 8 (2.0), G 16 at 2.2 with lr 3e-3 and 2.1 with 6e-3 (the better lr counts).
    diloco-m4 (at ddp's inner lr): best at G 16 at the small size, at G 8 at the large one; a run at another
    inner lr and a second seed that both would change the answer if they were counted."""
    out = []
    for size, params in (("a", 1000), ("b", 2000)):
        out += [
            run(size, params, "ddp", 8, 2.0),
            run(size, params, "ddp", 16, 2.2),
            run(size, params, "ddp", 16, 2.1, lr=6e-3),
        ]
    out += [run("a", 1000, "diloco-m4", 8, 2.2, olr=0.5), run("a", 1000, "diloco-m4", 16, 2.0, olr=1.0)]
    out += [run("b", 2000, "diloco-m4", 8, 2.0, olr=0.5), run("b", 2000, "diloco-m4", 16, 2.04, olr=0.5)]
    out.append(run("b", 2000, "diloco-m4", 16, 1.0, lr=6e-3, olr=0.5))  # off ddp's inner lr: not counted
    out.append(run("b", 2000, "diloco-m4", 8, 9.0, olr=0.5, seed=1))  # a second seed: not counted
    return out


def test_penalty_is_the_mean_over_sizes_of_the_loss_over_the_best_g():
    ddp, m4 = batch_penalties(rows())
    assert ddp["method"] == "ddp" and ddp["sizes"] == ["a", "b"]
    assert ddp["penalty"]["8"] == 0 and ddp["penalty"]["16"] == pytest.approx(0.05)  # 2.1 / 2.0 - 1
    assert ddp["best_global_batch"] == {"a": 8, "b": 8}
    # a: G 8 2.2 / 2.0 - 1 = 0.10, G 16 0; b: G 8 0, G 16 2.04 / 2.0 - 1 = 0.02
    assert m4["penalty"]["8"] == pytest.approx(0.05) and m4["penalty"]["16"] == pytest.approx(0.01)
    assert m4["best_global_batch"] == {"a": 16, "b": 8}


def test_a_size_missing_a_batch_for_any_method_is_left_out_for_every_method():
    partial = [r for r in rows() if not (r["size"] == "a" and r["method"] == "diloco-m4" and r["global_batch"] == 8)]
    ddp, m4 = batch_penalties(partial)
    assert m4["sizes"] == ddp["sizes"] == ["b"] and m4["penalty"]["16"] == pytest.approx(0.02)
    assert ddp["penalty"]["16"] == pytest.approx(0.05)


def test_print_shows_every_batch_and_the_best_by_size():
    lines = []
    print_batches(batch_penalties(rows()), say=lines.append)
    assert "G  16:  +5.00%" in lines[1] and "a 8, b 8" in lines[1]
    assert "diloco-m4" in lines[2] and "a 16, b 8" in lines[2]
