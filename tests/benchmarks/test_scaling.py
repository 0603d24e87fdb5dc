"""The scaling benchmark: its fits on hand-made numbers, --load on a hand-written file, and the quick
run end to end (its numbers are reported, never asserted: only their shape)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from scaling_fit import choose, fit_power_law, fits, gap_trend, line_fit  # noqa: E402

METHODS = ("ddp", "diloco-m1", "diloco-m2", "diloco-m4", "decoupled-m4")
LEARNERS = {"ddp": 4, "diloco-m1": 1, "diloco-m2": 2, "diloco-m4": 4, "decoupled-m4": 4}


def test_line_fit_slope_and_its_standard_error_by_hand():
    # y = 1 + 2x with residuals (+1, -2, +1) at x = 0, 1, 2: the slope stays 2, SSR = 6, Sxx = 2
    f = line_fit([0, 1, 2], [2, 1, 6])
    assert f["slope"] == pytest.approx(2.0) and f["intercept"] == pytest.approx(1.0)
    assert f["slope_se"] == pytest.approx(math.sqrt(6 / 1 / 2))


def test_power_law_of_halving_loss_per_decade():
    # loss halves per 10x parameters: alpha = log10(2) = 0.30103, exact, so no error
    p = fit_power_law([10, 100, 1000], [1.0, 0.5, 0.25])
    assert p["alpha"] == pytest.approx(math.log10(2)) and p["alpha_se"] == pytest.approx(0.0, abs=1e-12)
    assert p["A"] == pytest.approx(2.0)  # 2 * 10^-0.30103 = 1


def test_gap_trend_finds_parity_where_a_closing_gap_reaches_zero():
    # log ratio falls by half of log(1.1) per decade from 1.1 at N = 10: zero at N = 1000; noise
    # (+-0.002, summing to 0 and orthogonal to x) keeps the slope and gives it an error
    noise = [0.002, -0.004, 0.0, 0.004, -0.002]
    n = [10, 100, 1000, 1e4, 1e5]
    ratios = [1.1 ** (1 - (math.log10(x) - 1) / 2) * math.exp(e) for x, e in zip(n, noise, strict=True)]
    g = gap_trend(n, ratios)
    assert g["beta_per_decade"] == pytest.approx(-math.log(1.1) / 2, rel=1e-3)
    assert g["parity_params"] == pytest.approx(1000, rel=0.05)
    lo, hi = g["parity_log10_ci90"]
    assert lo < 3 < hi and hi - lo < 1
    assert "closes" in g["verdict"]


def test_gap_trend_says_when_it_cannot_say_and_when_the_gap_grows():
    flat = gap_trend([1e4, 1e5, 1e6, 1e7], [1.02, 1.03, 1.01, 1.02])
    assert flat["parity_params"] is None and "cannot say" in flat["verdict"]
    grows = gap_trend([1e4, 1e5, 1e6, 1e7], [1.010, 1.021, 1.029, 1.040])
    assert grows["parity_params"] is None and "away" in grows["verdict"]
    assert "too few" in gap_trend([1e4, 1e5], [1.1, 1.05])["verdict"]


def row(size, params, method, loss, seed=0, lr=3e-3, olr=None, batch=32):  # noqa: ANN001
    learners = LEARNERS[method]
    return {
        "ratio": 20.0,
        "size": size,
        "params": params,
        "tokens": 20 * params,
        "method": method,
        "learners": learners,
        "seed": seed,
        "inner_lr": lr,
        "outer_lr": olr,
        "global_batch": batch,
        "per_learner_batch": batch // learners,
        "eval_loss": loss,
    }


def hand_rows() -> list[dict]:
    """Three sizes; ddp follows 4 * N^-0.1 at its best point (lr 6e-3, G 64); diloco-m4 is 2 % worse at
    1e4, 1 % at 1e5, 0 % at 1e6; a worse grid point and a second seed at the largest size."""
    rows = []
    for i, n in enumerate((10_000, 100_000, 1_000_000)):
        size = f"s{i}"
        ddp = 4 * n**-0.1
        rows += [row(size, n, "ddp", ddp, lr=6e-3, batch=64), row(size, n, "ddp", ddp + 0.1)]
        m4 = ddp * (1.02 - 0.01 * i)
        rows += [row(size, n, "diloco-m4", m4, lr=6e-3, olr=1.0), row(size, n, "diloco-m4", 9.0, lr=6e-3, olr=0.5)]
    rows.append(row("s2", 1_000_000, "ddp", 4 * 1e6**-0.1 + 0.02, seed=1, lr=6e-3, batch=64))
    rows.append(row("s2", 1_000_000, "ddp", 1.0, seed=1))  # not the chosen point: ignored
    return rows


def test_choose_takes_the_best_seed0_point_and_averages_its_seeds():
    chosen = {(c["size"], c["method"]): c for c in choose(hand_rows())}
    big = chosen[("s2", "ddp")]
    assert (big["inner_lr"], big["global_batch"], big["seeds"]) == (6e-3, 64, 2)
    assert big["eval_loss"] == pytest.approx(4 * 1e6**-0.1 + 0.01) and big["grid_points"] == 2
    assert chosen[("s0", "diloco-m4")]["outer_lr"] == 1.0
    assert chosen[("s0", "diloco-m4")]["gap_vs_ddp"] == pytest.approx(0.02)


def load(path: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """`scaling.py --load PATH --json`: the finished process and its last line's report."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--load", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out, json.loads(out.stdout.strip().splitlines()[-1])


def test_load_prints_the_table_and_the_fits_of_a_hand_written_file(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"rows": hand_rows()}))
    out, report = load(path)
    assert [c["method"] for c in report["chosen"]] == ["ddp", "diloco-m4"] * 3
    ddp, m4 = report["fits"]
    # three sizes: 4 N^-0.1 exactly at the two small ones, +0.01 at the largest (mean of two seeds)
    # by hand: the largest size's log loss is up by ln(1 + 0.01 / (4e6^-0.1)) = 0.009904 at x = 6 ln 10, which
    # moves the slope by (ln 10 * 0.009904) / (2 (ln 10)^2) = 0.0021506
    assert ddp["method"] == "ddp" and ddp["power_law"]["alpha"] == pytest.approx(0.1 - 0.0021506, abs=2e-6)
    assert report["chosen"][4]["seeds"] == 2 and "±0.0141" in out.stdout  # stdev of 1.0048 and 1.0248
    assert "gap_trend" not in ddp
    # the gap 2 % -> 1 % -> 0 % (the ddp +0.01 at 1e6 makes the last one slightly negative)
    assert m4["gap_trend"]["beta_per_decade"] < 0
    assert "+2.00%" in out.stdout and "diloco-m4" in out.stdout and "alpha 0.1" in out.stdout


def test_load_leaves_out_runs_off_the_files_grid(tmp_path):
    """A run of an earlier, wider grid (here a G = 16 point better than the rest) stays in the file but is
    no grid point: the table is chosen from the configured grid only."""
    rows = hand_rows() + [row("s0", 10_000, "ddp", 0.5, lr=6e-3, batch=16)]
    config = {"global_batches": [32, 64], "inner_lrs": [3e-3, 6e-3], "outer_lrs": [0.5, 1.0]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"rows": rows, "config": config}))
    out, report = load(path)
    small = next(c for c in report["chosen"] if (c["size"], c["method"]) == ("s0", "ddp"))
    assert report["runs"] == len(rows) and small["global_batch"] == 64 and small["grid_points"] == 2


def test_choose_leaves_out_diloco_runs_at_an_inner_lr_that_is_no_longer_ddps_best():
    # a wider ddp grid moved ddp's best to 1.2e-2 G 16: the diloco runs at 6e-3 are stale, even the better one
    rows = hand_rows() + [row("s0", 10_000, "ddp", 1.0, lr=1.2e-2, batch=16)]
    rows += [row("s0", 10_000, "diloco-m4", 0.5, lr=6e-3, olr=0.5, batch=64)]  # stale, lowest loss of all
    rows += [row("s0", 10_000, "diloco-m4", 1.3, lr=1.2e-2, olr=1.0, batch=16)]
    rows += [row("s0", 10_000, "diloco-m4", 1.2, lr=1.2e-2, olr=0.5, batch=32)]
    chosen = {(c["size"], c["method"]): c for c in choose(rows)}
    m4 = chosen[("s0", "diloco-m4")]
    assert (m4["inner_lr"], m4["outer_lr"], m4["global_batch"], m4["grid_points"]) == (1.2e-2, 0.5, 32, 2)
    assert m4["gap_vs_ddp"] == pytest.approx(0.2)
    # a size whose diloco runs are all stale is not reported until they are made again
    rows.append(row("s1", 100_000, "ddp", 0.1, lr=1.2e-2))
    assert ("s1", "diloco-m4") not in {(c["size"], c["method"]) for c in choose(rows)}


def test_a_cells_bracketed_rates_are_its_grid_and_a_cell_not_bracketed_yet_is_left_out_of_the_fits():
    import scaling

    cfg = {"global_batches": [8], "inner_lrs": [3e-3, 6e-3], "outer_lrs": [0.5, 1.0]}
    rows = [row("s0", 10_000, "ddp", loss, lr=lr, batch=8) for lr, loss in ((3e-3, 2.0), (6e-3, 1.9), (1.2e-2, 1.8))]
    rows += [row("s0", 10_000, "ddp", 1.85, lr=2.4e-2, batch=8), row("s0", 10_000, "ddp", 1.0, lr=4.8e-2, batch=8)]
    rows += [row("s1", 100_000, "ddp", loss, lr=lr, batch=8) for lr, loss in ((3e-3, 1.5), (6e-3, 1.4), (1.2e-2, 1.3))]
    grid = {"inner_lr": [3e-3, 6e-3, 1.2e-2, 2.4e-2]}  # s0 bracketed (4.8e-2 is no grid point); s1 not yet
    tuning = [{"ratio": 20.0, "size": "s0", "method": "ddp", "grid": grid, "bracketed": {"inner_lr": True}}]
    chosen = {c["size"]: c for c in scaling.table(rows, cfg, tuning)}
    assert (chosen["s0"]["inner_lr"], chosen["s0"]["grid_points"]) == (1.2e-2, 4)
    assert chosen["s0"]["complete"] and chosen["s0"]["bracketed"]
    assert (chosen["s1"]["inner_lr"], chosen["s1"]["grid_points"]) == (6e-3, 2)  # the configured rates only
    assert not chosen["s1"]["complete"] and not chosen["s1"]["bracketed"]
    [ddp] = fits(list(chosen.values()))
    assert (ddp["sizes"], ddp["incomplete"]) == (1, 1)
    old = {c["size"]: c for c in scaling.table(rows, cfg, None)}  # a file from before the bracketing
    assert old["s0"]["inner_lr"] == 6e-3 and "complete" not in old["s0"]


class FakeRunner:
    """scaling.Runner's interface with a loss made up from the job: lowest at inner lr 0.02 (G 8) and
    outer lr 0.2; every batch of jobs asked for is kept."""

    def __init__(self) -> None:
        self.tuning: dict = {}
        self.calls: list[list[dict]] = []

    def many(self, jobs: list[dict]) -> list[dict]:
        self.calls.append(jobs)
        return [{**j, "eval_loss": self.loss(j)} for j in jobs]

    @staticmethod
    def loss(j: dict) -> float:
        inner = math.log2(j["inner_lr"] / 0.02) ** 2 + (0.0 if j["global_batch"] == 8 else 0.1)
        return 2.0 + inner + (0.0 if j["outer_lr"] is None else math.log2(j["outer_lr"] / 0.2) ** 2)

    def save(self) -> None:
        pass


def test_bracket_widens_ddps_inner_lr_then_each_diloco_methods_outer_lr_at_it():
    import scaling

    cfg = {**scaling.QUICK, "global_batches": [8, 16]}
    run = FakeRunner()
    scaling.bracket(cfg, run, 4.0, "12k")
    assert {(r, s) for r, s, _ in run.tuning} == {(4.0, "12k")} and {m for *_, m in run.tuning} == set(METHODS)
    ddp = run.tuning[(4.0, "12k", "ddp")]
    assert ddp["grid"] == {"inner_lr": [3e-3, 6e-3, 1.2e-2, 2.4e-2, 4.8e-2]} and ddp["chosen"] == {"inner_lr": 2.4e-2}
    for m in METHODS[1:]:
        t = run.tuning[(4.0, "12k", m)]
        assert t["grid"] == {"outer_lr": [0.125, 0.25, 0.5, 1.0]} and t["chosen"]["outer_lr"] == 0.25
        assert t["bracketed"] == {"outer_lr": True} and t["chosen"]["inner_lr"] == 2.4e-2
    every = [j for call in run.calls for j in call]
    assert all(j["inner_lr"] == 2.4e-2 for j in every if j["method"] != "ddp")  # at ddp's choice
    assert {j["global_batch"] for j in every} == {8, 16} and len(run.calls[0]) == 4  # 2 rates x 2 G at once
    assert len(run.calls[-1]) == 2  # a widening: one rate at both batches


def test_fits_leave_out_a_cell_whose_grid_is_unfinished():
    rows = hand_rows() + [row("s3", 10_000_000, "ddp", 1.0, lr=6e-3, batch=64)]  # 1 of 2 points done
    [ddp, m4] = fits(choose(rows))
    assert (ddp["sizes"], ddp["incomplete"]) == (3, 1) and (m4["sizes"], m4["incomplete"]) == (3, 0)
    assert ddp["power_law"]["alpha"] == pytest.approx(0.1 - 0.0021506, abs=2e-6)  # as without s3


def test_fits_skip_a_method_with_one_size():
    chosen = choose([row("s0", 10_000, "ddp", 2.0), row("s0", 10_000, "diloco-m1", 1.9, olr=0.5)])
    assert all("power_law" not in f and "gap_trend" not in f for f in fits(chosen))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_run_has_every_method_at_every_size_and_resumes(tmp_path, shakespeare):
    def quick(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "scaling.py"),
                "--quick",
                "--json",
                "--data",
                shakespeare,
                "--out",
                str(tmp_path / "q.json"),
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )

    out = quick("--jobs", "2")  # each grid trained by two worker processes
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    cells = {(c["ratio"], c["size"], c["method"]) for c in report["chosen"]}
    assert cells == {(r, s, m) for r, sizes in ((4.0, ("12k", "25k")), (2.0, ("12k",))) for s in sizes for m in METHODS}
    tuning = {(t["ratio"], t["size"], t["method"]): t for t in report["tuning"]}
    for c in report["chosen"]:
        t = tuning[(c["ratio"], c["size"], c["method"])]
        rate = "inner_lr" if c["method"] == "ddp" else "outer_lr"
        # bracketed: at least one rate past the configured two; the table's choice is the bracketing's
        assert c["eval_loss"] > 0 and c["grid_points"] == len(t["grid"][rate]) >= 3 and c["complete"]
        assert c[rate] == t["chosen"][rate] and c["bracketed"] == t["bracketed"][rate]
        assert c["per_learner_batch"] * LEARNERS[c["method"]] == c["global_batch"]
        assert c["seeds"] == (2 if (c["ratio"], c["size"]) in {(4.0, "12k"), (4.0, "25k")} else 1)
    saved = json.loads((tmp_path / "q.json").read_text())
    assert saved["chosen"] == report["chosen"] and len(saved["rows"]) == report["runs"]
    # the grid widened at its edges at the quick plan's one probed cell, every method, every point run
    edges = {(e["ratio"], e["size"], e["method"]): e for e in report["edges"]}
    assert set(edges) == {(4.0, "12k", m) for m in METHODS} and all(e["complete"] for e in edges.values())
    assert all(e["change"] <= 0 for e in edges.values()) and saved["edges"] == report["edges"]
    again = quick()  # every run is in the file: nothing is trained again
    assert again.returncode == 0 and "resuming" in again.stderr and "tok/param 12k" not in again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["chosen"] == report["chosen"]


def _children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (from /proc: no dependency)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_jobs_workers_end_when_the_benchmark_is_killed(tmp_path, shakespeare):
    """`--jobs 2` trains in worker processes; kill -9 of the benchmark must not leave them training."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--quick", "--jobs", "2", "--data", shakespeare]
    proc = subprocess.Popen([*cmd, "--out", str(tmp_path / "q.json")], stderr=subprocess.DEVNULL)
    try:
        workers: set[int] = set()
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            workers = {p for p in _children(proc.pid) if "spawn_main" in _cmdline(p)}
            time.sleep(0.2)
        assert len(workers) == 2, "the pool's two workers did not start"
    finally:
        proc.kill()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [w for w in workers if _alive(w)]
    for w in left:  # so that a failure leaves nothing behind
        os.kill(w, signal.SIGKILL)
    assert not left, f"workers {left} outlived the killed benchmark"
