"""The summary of a data-parallel run, in the fields `ddiloco run` writes (`launch.summary` and
`backends.local`), so that reports and benchmarks read both alike.

The window is [the first generation formed, the step that reached the budget] (for ddiloco:
[first learner joined, stop decided]); every worker is allocated for all of it, down or not:

    tokens_trained  every batch a worker computed (its journal), whether or not its step was merged
    tokens_merged   the tokens of every all-reduced step the final model holds (the lineage)
    tokens_lost     trained - merged: steps whose all-reduce failed, and (ddp) steps after the
                    checkpoint a restarted job resumed from
    goodput         seconds of every merged step, summed over its participants / (M * window)
    utilization     seconds of every step computed / (M * window)
    uptime          share of the window inside merged steps
"""

from __future__ import annotations

import json

from ..learner.journal import read_journals
from .checkpoint import read_manifest
from .config import DataParallelConfig
from .launcher import Launcher


def first_formed(config: DataParallelConfig) -> float | None:
    """Wall time the run's first generation formed (dataparallel.jsonl), or None."""
    try:
        lines = (config.run_dir / "dataparallel.jsonl").read_text().splitlines()
    except OSError:
        return None
    walls = [float(e["wall"]) for e in map(json.loads, lines) if e.get("kind") == "formed" and "wall" in e]
    return min(walls, default=None)


def summarize(config: DataParallelConfig, launcher: Launcher, params: int, end_wall: float) -> dict:
    """Counters and ratios of a finished run (no evaluation)."""
    manifest = read_manifest(config.checkpoint_dir) or {}
    lineage = manifest.get("lineage", {})
    start = float(lineage.get("window_start") or launcher.start_wall)
    # a job that failed before its first checkpoint resumes with a lineage that forgot when it began:
    # the window starts at the first generation that ever formed, lost work and all
    start = min(start, first_formed(config) or start)
    stop = float(lineage.get("last_commit") or end_wall) if manifest.get("final") else end_wall
    window = max(1e-9, stop - start)
    journals = [j for m in range(config.workers) for j in read_journals(config.worker_dir(m), "journal-*.json")]
    trained = sum(int(j.get("tokens", 0)) for j in journals)
    merged = int(lineage.get("tokens_merged", 0))
    allocated = config.workers * window
    steps = sum(int(j.get("steps", 0)) for j in journals)
    link_waited = sum(float(j.get("link_seconds", 0.0)) for j in journals)
    link_busy = sum(float(j.get("link_busy_seconds", 0.0)) for j in journals)
    sent = sum(float(j.get("allreduce_bytes_sent", 0.0)) for j in journals)  # each worker's ring bytes, booked
    m = config.workers
    ring_bf16 = 2 * (m - 1) / m * params * 2  # a bf16 ring all-reduce among M: each worker sends and receives this
    up = sent / max(1, steps)  # per worker and step, each way (the ring receives what it sends)
    downtime = sum(
        launcher.injector.downtime(w, stop - launcher.start_wall)
        - launcher.injector.downtime(w, max(0.0, start - launcher.start_wall))
        for w in range(m)
    )
    return {
        **config.as_dict(),
        "backend": launcher.backend,
        "tokens": trained,
        "tokens_trained": trained,
        "tokens_merged": merged,
        "tokens_lost": max(0, trained - merged),
        # the causes `ddiloco run` reports (`launch.summary.tokens_by_cause`): here every lost token was
        # lost at a failure (a step whose all-reduce failed, or, ddp, rolled back to the checkpoint)
        "tokens_by_cause": {
            "trained": trained,
            "merged": merged,
            "overwritten": 0,
            "refused": 0,
            "unsent": max(0, trained - merged),
            "in_transit": 0,
        },
        "goodput": float(lineage.get("useful_seconds", 0.0)) / allocated,
        "uptime": min(1.0, float(lineage.get("covered_seconds", 0.0)) / window),
        "utilization": sum(float(j.get("seconds", 0.0)) for j in journals) / allocated,
        "availability": 1.0 - downtime / allocated,
        "sim_seconds": window,
        "run_seconds": window,
        "outer_steps": int(lineage.get("step", 0)),  # every step is an all-reduce
        "inner_steps": int(lineage.get("step", 0)),
        "contributions": 0,
        "rejected_contributions": 0,
        "double_merged_steps": 0,
        "stall_seconds_max": max(
            float(lineage.get("longest_gap", 0.0)), stop - float(lineage.get("last_commit") or start)
        ),
        "longest_gap_seconds": float(lineage.get("longest_gap", 0.0)),
        "learner_processes": len(journals),
        "learner_restarts": launcher.worker_restarts,
        "synchronizer_restarts": 0,
        "job_restarts": launcher.job_restarts,
        "generations": launcher.coordinator.generation,
        "failed_steps": sum(int(j.get("failed_steps", 0)) for j in journals),
        "finished": bool(manifest.get("final")),
        "window_start": start,
        "window_stop": stop,
        "params": params,
        "bytes_up_per_step": up,
        "bytes_down_per_step": up,
        "allreduce_bf16_bytes_per_step": ring_bf16,
        "allreduce_workers": m,
        "allreduce_precision": config.allreduce_precision,
        "allreduce_bytes_sent": sent,
        "bandwidth_ratio_up": ring_bf16 / up if up else None,
        "bandwidth_ratio_down": ring_bf16 / up if up else None,
        "bandwidth_ratio_both_ways": ring_bf16 / up if up else None,
        # the emulated link under the all-reduce (`link`): seconds backward waited for it after its last
        # gradient (measured, per worker-step), and the link's own busy seconds (pacing and latency of
        # every bucket, part of it overlapped with backward)
        "link": {
            "latency_ms": config.link.latency_ms,
            "bandwidth_MBps": config.link.bandwidth_mb_s,
            "jitter_ms": config.link.jitter_ms,
        },
        "link_seconds_waited": link_waited,
        "link_seconds_per_step": link_waited / max(1, steps),
        "link_busy_seconds_per_step": link_busy / max(1, steps),
        "run_dir": str(config.run_dir),
    }
