"""The synchronous part of a RocksDB checkpoint, one backend in-process:
where it goes, at 1M, 10M (and more) keys.

    python benchmarks/bench_state_sync.py [--keys 1000000 10000000]
        [--updates 100000] [--checkpoints 20] [--memory-mb 256]

Per key count: one value state is bulk-loaded (sorted entries written into
SST files with ``SstFileWriter`` and ingested: seconds, where filling it
through the job takes minutes), then ``--checkpoints`` times: ``--updates``
running-count updates of uniformly random keys through the state's handle
(W2's per-checkpoint work; every 1,024 updates the backend is asked, as a
task asks between batches, whether to start its early flush:
``prepare_snapshot``, when the backend has one), then a snapshot — its
synchronous part timed in
two pieces (the write-back of the value cache; the RocksDB checkpoint:
memtable flush and hard links) — and its asynchronous part (the incremental
upload into a local checkpoint folder). Reported as JSON: fill time, update
rate, sync p50/p99 and its pieces, async p50, bytes uploaded per checkpoint,
peak resident memory of this process.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from lockgate.state.backend import ValueStateDescriptor
from lockgate.state.backends import BackendScope, RocksDBStateBackend
from lockgate.state.factory import create_keyed_backend
from lockgate.state.keygroups import fmix32
from lockgate.state.rocksdb.io import options, require
from lockgate.state.rocksdb.tables import state_id
from lockgate.state.serde import StateSerializer, key_bytes

MAX_PARALLELISM = 128
CHUNK = 2_000_000


def bulk_load(db: Any, name: str, keys: int, config: RocksDBStateBackend,
              folder: str, dumps: Any) -> None:
    """Write the entries ``key -> 1`` for ``range(keys)`` into sorted SST
    files and ingest them (keys sorted by their RocksDB bytes)."""
    rd = require()
    sid = state_id(name)
    one = dumps(1)
    entries = []
    for k in range(keys):
        kb = key_bytes(k)
        kg = fmix32(zlib.crc32(kb)) % MAX_PARALLELISM
        entries.append(kg.to_bytes(2, "big") + sid + len(kb).to_bytes(4, "big") + kb)
    entries.sort()
    files = []
    for start in range(0, keys, CHUNK):  # files of disjoint key ranges
        path = os.path.join(folder, f"bulk-{start}.sst")
        w = rd.SstFileWriter(options(config))
        w.open(path)
        for e in entries[start:start + CHUNK]:
            w[e] = one
        w.finish()
        files.append(path)
    db.ingest_external_file(files)  # to the last level: nothing to compact


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else 0.0


def run(keys: int, updates: int, checkpoints: int, memory_mb: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-bench-sync-"))
    config = RocksDBStateBackend(local_dir=str(tmp / "local"), memory_mb=memory_mb)
    job = tmp / "job"
    job.mkdir()
    b: Any = create_keyed_backend(config, MAX_PARALLELISM, range(MAX_PARALLELISM),
                                  StateSerializer(), BackendScope("bench", "op", 0, 0, str(job)))
    state = b.get_state(ValueStateDescriptor("count", default=0))
    t = time.monotonic()
    bulk_load(b.db, "count", keys, config, str(tmp), b.serializer.dumps)
    fill_s = time.monotonic() - t
    rng = random.Random(7)
    syncs, writebacks, natives, asyncs, sizes, rates = [], [], [], [], [], []
    for i in range(checkpoints):
        t = time.monotonic()
        prepare = getattr(b, "prepare_snapshot", None)
        for u in range(updates):
            b.current_key = rng.randrange(keys)
            state.update(state.value() + 1)
            if prepare is not None and u % 1024 == 0:
                prepare(time.monotonic())
        rates.append(updates / (time.monotonic() - t))
        t0 = time.monotonic()
        b.flush()
        t1 = time.monotonic()
        snap = b.snapshot()
        t2 = time.monotonic()
        before = _shared_bytes(job)
        with open(tmp / f"state-{i}", "wb") as out:
            snap.write_incremental(out, i + 1)
            private = out.tell()
        asyncs.append(time.monotonic() - t2)
        sizes.append(_shared_bytes(job) - before + private)
        writebacks.append(t1 - t0)
        natives.append(t2 - t1)
        syncs.append(t2 - t0)
    b.close()
    shutil.rmtree(tmp, ignore_errors=True)
    ms = 1000.0
    return {
        "keys": keys, "updates_per_checkpoint": updates, "checkpoints": checkpoints,
        "fill_s": round(fill_s, 1), "updates_per_s": round(pct(rates, 0.5)),
        "sync_p50_ms": round(pct(syncs, 0.5) * ms, 1),
        "sync_p99_ms": round(pct(syncs, 0.99) * ms, 1),
        "writeback_p50_ms": round(pct(writebacks, 0.5) * ms, 1),
        "native_checkpoint_p50_ms": round(pct(natives, 0.5) * ms, 1),
        "native_checkpoint_p99_ms": round(pct(natives, 0.99) * ms, 1),
        "async_p50_ms": round(pct(asyncs, 0.5) * ms, 1),
        "bytes_per_checkpoint_p50": int(pct(sizes, 0.5)),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "loadavg": os.getloadavg()[0],
    }


def _shared_bytes(job: Path) -> int:
    shared = job / "shared"
    return sum(f.stat().st_size for f in shared.iterdir()) if shared.exists() else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--updates", type=int, default=100_000)
    ap.add_argument("--checkpoints", type=int, default=20)
    ap.add_argument("--memory-mb", type=int, default=256)
    ap.add_argument("--write-buffer-mb", type=float, default=None,
                    help="override the write buffer size (an experiment)")
    args = ap.parse_args()
    if args.write_buffer_mb is not None:
        from lockgate.state.rocksdb import io as rocksdb_io

        base = rocksdb_io.options

        def patched(config: RocksDBStateBackend) -> Any:
            opts = base(config)
            opts.set_write_buffer_size(int(args.write_buffer_mb * (1 << 20)))
            return opts

        rocksdb_io.options = patched  # type: ignore[assignment]
    for keys in args.keys:
        print(json.dumps(run(keys, args.updates, args.checkpoints, args.memory_mb)), flush=True)


if __name__ == "__main__":
    main()
