"""Synchronizer scale: one real `ddiloco synchronizer` process merging fragments of 1M to 150M-parameter
models from M learners, against memcpy measured in the same run.

Per model size and learner count M, the benchmark starts the synchronizer (P = 4 fragments, K = M,
no grace, bf16 uploads, write-ahead checkpoints every merge, updates down in the default codec),
registers M sessions and runs rounds: all M push their outer gradient (on the bulk socket plane,
or over gRPC with `--plane grpc`) for a fragment at
once. The round time is the synchronizer's own (its `sent` events): from the round closing to the
merged fragment queued for every learner (merge, outer step, encoding, write-ahead checkpoint);
`delivered_ms` adds the transfer, from the last push's reply to the last byte at every learner.
Meanwhile another process sends heartbeats and times them: they must not wait for merges.

* `round_ms_per_mb`: round time per MB of the fragment in fp32.
* `round_vs_memcpy`: round time over one memcpy of the bytes a round touches (M contributions in
  wire precision, the fragment's parameters and momentum in fp32, its update at the down codec),
  at the memcpy bandwidth measured here. Aim: <= 4.
* `checkpoint_ms`, `checkpoint_vs_raw`: a checkpoint's write against writing and fsyncing the same
  bytes with plain file calls on the same disk (the physical limit), measured before and after the
  rounds (median of both).
* `round_vs_limit`: the round against both of its physical limits measured here, one memcpy of the
  bytes it touches plus that raw durable write (a write-ahead round waits for the disk, which
  memcpy bandwidth does not bound). Aim: <= 4.
* `merged_ms`, `merged_vs_memcpy`: the same round without the checkpoint (merge, outer step,
  encoding), against the same memcpy.
* `heartbeat_p50_ms`, `heartbeat_p99_ms`: heartbeat round trips during the rounds. Aim: p99 < 50 ms.
* `peak_rss_over_need`: the synchronizer's peak RSS above an idle process that imports the same
  libraries, over what it must hold (owned fp32 parameters and momentum, one incoming buffer per
  contribution in wire precision, one fragment of working space). Aim: <= 1.5.
  `peak_rss_over_fp32`: the whole peak RSS over the model's fp32 size.

Everything runs on this machine's cores: the learners' pushes and the synchronizer share them.

    python benchmarks/synchronizer_scale.py                  # 1M..150M, M = 2, 4, 8 (~15 minutes)
    python benchmarks/synchronizer_scale.py --quick --json   # 1M and 10M, M = 2 and 4
    python benchmarks/synchronizer_scale.py --plane grpc     # pushes over gRPC instead of the bulk socket
    python benchmarks/synchronizer_scale.py --sizes 1e9 --learners 4 --json   # 4 shards of 250M (~4 minutes)

From 1e9 parameters (or with `--shards N`) the model is sharded over N synchronizer processes with M
learner stand-in processes (`synchronizer_scale_shards.py`): the same figures per shard, and the
worst of them per row.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from ddiloco.core import plan_for_model
from ddiloco.launch.procs import ProcessTable
from ddiloco.records.events import read_events

console = Console(stderr=True, width=180)
SHARDED_FROM, SHARDED_FROM_SHARDS = int(1e9), 4  # from this size, by default, the model over this many shards
IDLE_RSS = (
    "import ddiloco.synchronizer.server, ddiloco.cli.synchronizer, torch, grpc, re; "
    "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))"
)


def model(params: int) -> dict[str, torch.Tensor]:
    """16 weight matrices of 1024 columns (a stand-in for a transformer's layers) and a bias each."""
    rows = max(1, params // (16 * 1024))
    return {
        f"layer{i}.{kind}": (torch.randn(rows, 1024) * 0.02 if kind == "weight" else torch.zeros(1024))
        for i in range(16)
        for kind in ("weight", "bias")
    }


def memcpy_gb_s() -> float:
    src = torch.randn(64 * 1024 * 1024 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return src.numel() * 4 / min(times) / 1e9


def raw_write_seconds(directory: Path, nbytes: int) -> list[float]:
    """The physical limit of a checkpoint: the same bytes written to new files on the same disk and
    fsynced, 5 in a row as checkpoints come (a disk's first write is fast until the kernel's dirty-page
    limit throttles the writer)."""
    data = memoryview(bytearray(nbytes))
    times = []
    for i in range(5):
        t0 = time.perf_counter()
        with open(directory / f"raw{i}.bin", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        times.append(time.perf_counter() - t0)
    for i in range(5):
        (directory / f"raw{i}.bin").unlink()
    return times


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


sys.path.insert(0, str(Path(__file__).resolve().parent))
from synchronizer_scale_run import FRAGMENTS, Run, start_probe  # noqa: E402
from synchronizer_scale_shards import heartbeat_figures, measure_sharded  # noqa: E402


def measure(
    params_count: int, learners: int, rounds: int, memcpy: float, idle_rss: int, bulk_socket: bool = True
) -> dict:
    params = model(params_count)
    numel = sum(t.numel() for t in params.values())
    procs = ProcessTable()
    with tempfile.TemporaryDirectory() as tmp_name:
        try:
            run = Run(procs, Path(tmp_name), params, learners, bulk_socket)
            fragments = _fragment_names(params)
            frag_numel = [sum(params[n].numel() for n in f) for f in fragments]
            checkpoint_bytes = max(frag_numel) * 8  # one fragment's params + momentum, fp32
            raw_writes = raw_write_seconds(Path(tmp_name), checkpoint_bytes)
            grads = [{n: torch.randn_like(params[n]) * 1e-3 for n in f} for f in fragments]
            probe = start_probe(run, Path(tmp_name) / "stop-probe")
            times, sizes = [], []
            for r in range(rounds + 1):  # round 0 warms up every fragment and is not counted
                for p in range(len(fragments)):
                    errors: list[BaseException] = []
                    pushers = [
                        threading.Thread(target=_catch, args=(errors, run.push, m, p, r, grads[p]))
                        for m in range(learners)
                    ]
                    for t in pushers:
                        t.start()
                    for t in pushers:
                        t.join()
                    if errors:
                        raise errors[0]
                    last_in = time.perf_counter()
                    done = run.wait_updates(p, r + 1, 600)
                    if r > 0:
                        times.append(done - last_in)
                        sizes.append(frag_numel[p])
            (Path(tmp_name) / "stop-probe").touch()
            latencies = json.loads(probe.communicate(timeout=60)[0].strip().splitlines()[-1])
            rss = peak_rss(run.child.pid)
        finally:
            procs.stop_all()
        events = list(read_events(Path(tmp_name) / "events.jsonl"))
        raw_write = statistics.median(raw_writes + raw_write_seconds(Path(tmp_name), checkpoint_bytes))
    sent = [e for e in events if e["kind"] == "sent" and e["version"] >= 2]
    server = [e["round_seconds"] for e in sent]
    merged = [e["merged_seconds"] for e in sent]
    writes = [e["write_seconds"] for e in events if e["kind"] == "checkpoint" and e.get("write_seconds")]
    fragment_mb = statistics.mean(sizes) * 4 / 1e6
    round_s = statistics.median(server)
    touched = statistics.mean(sizes) * (2 * learners + 4 + 4 + 4)  # contributions bf16; params, momentum, update
    copy_s = touched / (memcpy * 1e9)  # one memcpy of those bytes
    largest = max(frag_numel)
    need = numel * 8 + largest * (2 * learners + 4)  # params + momentum fp32; incoming bf16; one workspace
    lat = sorted(latencies)
    return {
        "params": numel,
        "learners": learners,
        "rounds": len(times),
        "plane": "socket" if bulk_socket else "grpc",
        "fragment_mb": fragment_mb,
        "round_ms": round_s * 1e3,
        "round_ms_per_mb": round_s * 1e3 / fragment_mb,
        "round_vs_memcpy": round_s / copy_s,
        "round_vs_limit": round_s / (copy_s + raw_write),
        "raw_write_ms": raw_write * 1e3,
        "merged_ms": statistics.median(merged) * 1e3,
        "merged_vs_memcpy": statistics.median(merged) / copy_s,
        "delivered_ms": statistics.median(times) * 1e3,
        "checkpoint_ms": statistics.median(writes) * 1e3,
        "checkpoint_vs_raw": statistics.median(writes) / raw_write,
        **heartbeat_figures(lat),
        "peak_rss_mb": rss / 1e6,
        "peak_rss_over_fp32": rss / (numel * 4),
        "peak_rss_over_need": (rss - idle_rss) / need,
    }


def _catch(errors: list[BaseException], fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as exc:  # handed to the main thread
        errors.append(exc)


def _fragment_names(params: dict[str, torch.Tensor]) -> list[list[str]]:
    """The synchronizer's plan, made as it makes it: from the init file, whose tensors are sorted."""
    return [list(names) for names in plan_for_model(dict(sorted(params.items())), FRAGMENTS).names]


def shard_table(row: dict, memcpy: float) -> Table:
    """A sharded run's figures, one line per shard."""
    table = Table(
        title=f"{row['params'] / 1e6:.0f}M parameters over {row['shards']} shards (P = {row['fragments']}), "
        f"M = {row['learners']}; memcpy {memcpy:.1f} GB/s, raw write {row['raw_write_ms']:.0f} ms; "
        f"the machine gave {row['machine_used_gb']:.1f} GB; an idle synchronizer's heartbeats meanwhile: "
        f"p50 {row['idle_heartbeat_p50_ms']:.1f} / p99 {row['idle_heartbeat_p99_ms']:.1f} ms"
    )
    for col in (
        "shard",
        "fragment MB",
        "round ms",
        "x limit",
        "merged ms",
        "delivered ms",
        "checkpoint ms",
        "heartbeat p50 / p99 ms",
        "peak RSS MB",
        "need MB",
        "RSS / need",
    ):
        table.add_column(col, justify="right")
    for s in row["per_shard"]:
        table.add_row(
            str(s["shard"]),
            f"{s['fragment_mb']:.0f}",
            f"{s['round_ms']:.0f}",
            f"{s['round_vs_limit']:.2f}",
            f"{s['merged_ms']:.0f}",
            f"{s['delivered_ms']:.0f}",
            f"{s['checkpoint_ms']:.0f}",
            f"{s['heartbeat_p50_ms']:.1f} / {s['heartbeat_p99_ms']:.1f}",
            f"{s['peak_rss_mb']:.0f}",
            f"{s['need_mb']:.0f}",
            f"{s['peak_rss_over_need']:.2f}",
        )
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1e6,1e7,5e7,1.5e8", help="model sizes in parameters")
    p.add_argument("--learners", default="2,4,8")
    p.add_argument("--rounds", type=int, default=2, help="measured rounds per fragment")
    p.add_argument(
        "--plane",
        choices=("socket", "grpc"),
        default="socket",
        help="how the learners push: the bulk socket plane (the default) or gRPC",
    )
    p.add_argument(
        "--shards",
        type=int,
        default=None,
        help="shard the model over N synchronizer processes, with M learner stand-in processes "
        "(synchronizer_scale_shards.py); default: 4 from 1e9 parameters, else one synchronizer driven from here",
    )
    p.add_argument("--keep", type=Path, default=None, help="with --shards: keep the raw timings in this folder")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # so `finally` ends the children
    if args.quick:
        args.sizes, args.learners, args.rounds = "1e6,1e7", "2,4", 1
    torch.set_num_threads(1)
    memcpy = memcpy_gb_s()
    idle_rss = (
        int(subprocess.run([sys.executable, "-c", IDLE_RSS], capture_output=True, text=True, check=True).stdout) * 1024
    )
    rows = []
    for size in (int(float(s)) for s in args.sizes.split(",")):
        for m in (int(x) for x in args.learners.split(",")):
            shards = args.shards if args.shards is not None else (SHARDED_FROM_SHARDS if size >= SHARDED_FROM else None)
            console.log(f"{size / 1e6:.0f}M parameters, M = {m}" + (f", {shards} shards" if shards else ""))
            if shards:
                rows.append(
                    measure_sharded(
                        size,
                        m,
                        shards,
                        args.rounds,
                        memcpy,
                        idle_rss,
                        raw_write_seconds,
                        peak_rss,
                        args.plane == "socket",
                        args.keep / f"{size:.0e}-M{m}" if args.keep else None,
                    )
                )
            else:
                rows.append(measure(size, m, args.rounds, memcpy, idle_rss, args.plane == "socket"))
    table = Table(title=f"synchronizer rounds (P = {FRAGMENTS}, K = M, write-ahead on); memcpy {memcpy:.1f} GB/s")
    for col in (
        "params",
        "M",
        "fragment MB",
        "round ms",
        "ms / MB",
        "x memcpy",
        "merged ms",
        "merged x memcpy",
        "delivered ms",
        "checkpoint x raw",
        "x limit",
        "heartbeat p50 / p99 ms",
        "peak RSS MB",
        "RSS / need",
        "RSS / fp32",
    ):
        table.add_column(col, justify="right")
    for r in (r for r in rows if "shards" not in r):
        table.add_row(
            f"{r['params'] / 1e6:.0f}M",
            str(r["learners"]),
            f"{r['fragment_mb']:.0f}",
            f"{r['round_ms']:.0f}",
            f"{r['round_ms_per_mb']:.2f}",
            f"{r['round_vs_memcpy']:.1f}",
            f"{r['merged_ms']:.0f}",
            f"{r['merged_vs_memcpy']:.1f}",
            f"{r['delivered_ms']:.0f}",
            f"{r['checkpoint_vs_raw']:.2f}",
            f"{r['round_vs_limit']:.1f}",
            f"{r['heartbeat_p50_ms']:.1f} / {r['heartbeat_p99_ms']:.1f}",
            f"{r['peak_rss_mb']:.0f}",
            f"{r['peak_rss_over_need']:.2f}",
            f"{r['peak_rss_over_fp32']:.2f}",
        )
    if any("shards" not in r for r in rows):
        console.print(table)
    for r in (r for r in rows if "shards" in r):
        console.print(shard_table(r, memcpy))
    console.print(
        "aims: round within 4x memcpy of the bytes it touches (x memcpy; x limit adds the raw durable "
        "write of its checkpoint); heartbeat p99 < 50 ms; "
        "peak RSS within 1.5x of what it must hold (the learners' pushes share these cores)"
    )
    if args.json:
        print(json.dumps({"rows": rows, "memcpy_gb_s": memcpy, "idle_rss_mb": idle_rss / 1e6}, sort_keys=True))


if __name__ == "__main__":
    main()
