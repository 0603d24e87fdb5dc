"""Reads back a wandb offline run file (`run-*.wandb`), to check what a run logged without the network.

The file is wandb's header (":W&B", magic, version: 7 bytes) and then LevelDB's log format: 32 KiB
blocks of records, each with a 7-byte header (CRC, little-endian length, type: full, first, middle,
last); every record is a protobuf `Record` of wandb's internal schema.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    out, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # the block's tail is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        body = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            out.append(body)
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            out.append(pending + body)
        elif kind == 0 and length == 0:
            break
    return out


def history(path: Path) -> list[dict]:
    """Every `run.log` call's values, as dicts."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for raw in records(path):
        record = pb.Record()
        try:
            record.ParseFromString(raw)
        except Exception:  # noqa: BLE001 - a record still being written: read the file again later
            continue
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows
