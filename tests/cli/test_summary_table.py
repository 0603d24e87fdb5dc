"""The summary a person reads (`cli.output.summary_table`): sections of labelled rows in people's
units, one row per figure (no `tokens_trained` beside `tokens trained`), the same for every method."""

from __future__ import annotations

from rich.console import Console

from ddiloco.cli.output import SUMMARY_ROWS, summary_table

RUN = {
    "method": "decoupled",
    "learners": 4,
    "params": 45952,
    "fragments": 24,
    "eval_loss": 2.34567,
    "goodput": 0.8731,
    "run_seconds": 12.5,
    "sim_seconds": 12.5,
    "tokens": 151_552,
    "tokens_trained": 151_552,
    "tokens_merged": 150_000.0,
    "tokens_lost": 1552,
    "tokens_by_cause": {"trained": 151_552, "merged": 150_000.0, "overwritten": 0.0, "unsent": 1552.0},
    "bytes_up_per_step": 9771.2,
    "run_dir": "runs/x",
    "window_start": 1.797e9,
}


def text(result: dict) -> str:
    console = Console(record=True, width=120)
    console.print(summary_table(result, "ddiloco run"))
    return console.export_text()


def test_sections_labels_and_units():
    out = text(RUN)
    for section, _ in SUMMARY_ROWS:
        if section not in ("faults", "syncs"):  # no counters of these in this result
            assert section in out, section
    assert "87.3 %" in out and "2.3457" in out and "45,952" in out and "9.77 kB" in out and "12.5 s" in out
    assert "tokens_trained" not in out and "window_start" not in out and "1.797e" not in out
    assert out.count("12.5 s") == 1  # simulated time is the run time in a real run: shown once
    assert "every field: runs/x/summary.json, or --json" in out


def test_tokens_lost_by_cause_only_where_some_were():
    out = text(RUN)
    assert "of which unsent" in out and "1,552" in out
    assert "of which overwritten" not in out


def test_a_simulated_run_shows_its_tokens_as_trained_and_its_simulated_time():
    out = text({"method": "ddp", "tokens": 20480, "sim_seconds": 6.01, "eval_loss": 5.5})
    assert "trained" in out and "20,480" in out and "simulated time" in out and "6.01 s" in out
