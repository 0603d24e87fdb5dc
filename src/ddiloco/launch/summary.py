"""The final numbers of a run, computed from what the processes left on disk.

Sources: each synchronizer shard's event log (merges with the admitted work, joins, the stop) and
final status, each learner process's journal (tokens and compute seconds it trained, including steps
after its last heartbeat before a kill -9), and the checkpoints (the final global parameters).

The window of the run is [first learner joined, stop decided]: every learner is allocated for all of
it, down or not, as in the simulator's ledger (`ddiloco.sim.ledger`):

    goodput     = sum over merged work of compute seconds * fragment share / (M * window)
    utilization = compute seconds of every step trained / (M * window)
    uptime      = share of the window covered by work that reached the global model
    stall       = longest time inside the window without any shard merging
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from pathlib import Path

from ..learner.journal import read_journals
from ..records.events import read_events
from ..records.intervals import union_length


def read_shard_events(sync_dirs: list[Path]) -> list[dict]:
    events: list[dict] = []
    for d in sync_dirs:
        events.extend(without_lost_merges(read_events(d / "events.jsonl")))
    return sorted(events, key=lambda e: e.get("t", 0.0))


def without_lost_merges(events: Iterable[dict]) -> list[dict]:
    """One shard's events, less the merges its crash lost: a merge is logged when it is computed, but
    reaches the model only if its version was on disk before the shard died. A restart restores an
    older version; the merges past it were undone (their work is sent again and merged anew), so
    counting them would count that work twice."""
    kept: list[dict] = []
    for e in events:
        if e.get("kind") == "restored" and isinstance(e.get("versions"), dict):
            restored = {str(p): int(v) for p, v in e["versions"].items()}
            kept = [
                k
                for k in kept
                if k.get("kind") != "merge" or int(k.get("version", 0)) <= restored.get(str(k.get("fragment")), 0)
            ]
        kept.append(e)
    return kept


def summarize(
    sync_dirs: list[Path],
    learner_dirs: list[Path],
    learners: int,
    end_wall: float,
    fallback_start: float,
) -> dict:
    """Counters and ratios of a finished run (no evaluation; see `evaluate_final`)."""
    events = read_shard_events(sync_dirs)
    joins = [e["t"] for e in events if e.get("kind") == "join"]
    stops = [e["t"] for e in events if e.get("kind") == "stop"]
    start = min(joins) if joins else fallback_start
    stop = min(stops) if stops else end_wall
    window = max(1e-9, stop - start)
    merges = [e for e in events if e.get("kind") == "merge"]
    useful = tokens_merged = 0.0
    contributions = 0
    intervals = []
    merge_times = [start]
    for e in merges:
        merge_times.append(e["t"])
        for a in e.get("admitted", []):
            contributions += 1
            useful += a["seconds"] * a["share"]
            tokens_merged += a["tokens"] * a["share"]
            if "span_start" in a and "snapshot_wall" in a:
                intervals.append((max(start, a["span_start"]), min(stop, a["snapshot_wall"])))
    inside = sorted(t for t in merge_times if start <= t <= stop) + [stop]
    stall = max(b - a for a, b in zip(inside, inside[1:], strict=False)) if len(inside) > 1 else window
    journals = [j for d in learner_dirs for j in read_journals(d, "journal-*.json")]
    tokens_trained = sum(int(j.get("tokens", 0)) for j in journals)
    busy = sum(float(j.get("seconds", 0.0)) for j in journals)
    statuses = []
    for d in sync_dirs:
        path = d / "summary.json"
        if path.is_file():
            with contextlib.suppress(json.JSONDecodeError):
                statuses.append(json.loads(path.read_text()))
    allocated = learners * window
    if busy < useful <= busy * (1 + 1e-9):
        useful = busy  # the same step times summed in another order: merged work is part of trained work
    tokens_merged = round(tokens_merged, 6)  # shares of whole tokens: 91840.00000000001 is 91840
    return {
        "tokens": tokens_trained,
        "tokens_trained": tokens_trained,
        "tokens_merged": tokens_merged,
        "tokens_lost": max(0.0, tokens_trained - tokens_merged),
        "tokens_by_cause": tokens_by_cause(journals, statuses, tokens_trained, tokens_merged),
        "overlap_chosen": overlap_chosen(learner_dirs),
        "goodput": useful / allocated,
        "uptime": min(1.0, union_length([i for i in intervals if i[1] > i[0]]) / window),
        "utilization": busy / allocated,
        "sim_seconds": window,
        "run_seconds": window,
        "outer_steps": len(merges),
        "contributions": contributions,
        "rejected_contributions": sum(
            1
            for e in events
            if e.get("kind") == "rejected" or (e.get("kind") == "refused" and e.get("method") == "Push")
        ),
        "double_merged_steps": sum(int(s.get("double_merged_steps", 0)) for s in statuses),
        "stall_seconds_max": stall,
        "longest_gap_seconds": stall,
        "learner_processes": len(journals),
        "window_start": start,
        "window_stop": stop,
        **bandwidth(statuses, sum(int(j.get("steps", 0)) for j in journals), learners),
    }


def overlap_chosen(learner_dirs: list[Path]) -> dict:
    """Each learner's tau at its end and why (`--overlap auto` chooses it from the link), from the
    journal of its last process."""
    chosen = {}
    for d in learner_dirs:
        last = max(read_journals(d, "journal-*.json"), key=lambda j: j.get("updated", 0.0), default=None)
        if last is not None and last.get("overlap") is not None:
            chosen[d.name] = {"tau": last["overlap"], "why": last.get("overlap_why")}
    return chosen


def tokens_by_cause(journals: list[dict], statuses: list[dict], trained: int, merged: float) -> dict:
    """Every trained token by where it went (share-weighted, as merged tokens are):

        trained = merged + overwritten + refused + unsent + in_transit

    overwritten: trained since a snapshot and lost when the next global value overwrote it
    (`--arrival overwrite`); refused: in contributions the synchronizer refused (past S versions
    late, or invalid); unsent: never left its learner (a kill -9, or the end of the run); in transit:
    sent but neither merged nor refused (a broken connection, a synchronizer crash). The first four
    are measured where they happen (the learners' journals, the shards' ledgers); the last is what
    was sent less what arrived, so a learner that never reported what it sent (an older journal)
    leaves `sent` null and the rest unsplit."""
    if any("tokens_sent" not in j for j in journals):
        return {"trained": trained, "merged": merged, "sent": None}
    sent = sum(float(j["tokens_sent"]) for j in journals)
    overwritten = sum(float(j.get("tokens_overwritten", 0.0)) for j in journals)
    refused = sum(float(s.get("tokens_refused", 0.0)) for s in statuses)
    return {
        "trained": trained,
        "merged": merged,
        "overwritten": overwritten,
        "refused": refused,
        "unsent": trained - sent - overwritten,
        "in_transit": sent - merged - refused,
        "sent": sent,
    }


def bandwidth(statuses: list[dict], steps: int, learners: int) -> dict:
    """Bytes per learner per inner step each way (the shards' bulk frames), and how many times fewer
    than a ring all-reduce of the same model in bf16 among as many workers: each worker sends and
    receives 2 (W - 1) / W of the model per step."""
    params = sum(int(s.get("params", 0)) for s in statuses)
    up = sum(int(s.get("bytes_received", 0)) for s in statuses) / max(1, steps)
    down = sum(int(s.get("bytes_sent", 0)) for s in statuses) / max(1, steps)
    ring = 2 * (learners - 1) / learners * params * 2

    def per_update(form: str) -> float | None:
        """Bytes of one update sent in this form, over every shard (None: none was)."""
        n = sum(int(s.get("updates_sent", {}).get(form, 0)) for s in statuses)
        nbytes = sum(int(s.get("update_bytes_sent", {}).get(form, 0)) for s in statuses)
        return nbytes / n if n else None

    def ratio(ours: float) -> float | None:
        return ring / ours if ours > 0 and ring > 0 else None

    sent_as_difference = sum(int(s.get("update_bytes_sent", {}).get("difference", 0)) for s in statuses)
    their_whole = sum(int(s.get("difference_whole_bytes", 0)) for s in statuses)

    return {
        "params": params,
        "inner_steps": steps,
        "bytes_up_per_step": up,
        "bytes_down_per_step": down,
        # one update down as a difference, and as a whole value: how many of each a run sends, and
        # which fragments go which way, depend on timing (joins, versions coalesced away)
        "bytes_per_update_difference": per_update("difference"),
        "bytes_per_update_whole": per_update("whole"),
        # the differences' bytes over their whole bf16 values' payload: per fragment, not per mix of
        # fragments (above, a run whose differences went to the larger fragments reads costlier)
        "difference_over_whole": sent_as_difference / their_whole if their_whole else None,
        "allreduce_bf16_bytes_per_step": ring,
        "allreduce_workers": learners,
        "bandwidth_ratio_up": ratio(up),
        "bandwidth_ratio_down": ratio(down),
        "bandwidth_ratio_both_ways": ratio((up + down) / 2),
    }  # the ring's both ways are 2 * ring
