"""W2: a keyed running count over uniformly random keys, on the heap and the
RocksDB state backend, at growing key spaces.

    python benchmarks/bench_state.py [--keys 1000000 10000000 30000000]
        [--backends heap rocksdb] [--measure 30] [--launcher local]
        [--fill-through-job] [--savepoint-cache DIR] [--early-flush on|off]
        [--changelog on|off]

Per backend and key space (2 tasks, a checkpoint every 2 s): the state
starts full, every key of the key space with a count of 1. By default the
benchmark writes that state offline as a savepoint in the canonical
key-group format (what a savepoint of either backend holds: one block per
key group per task; ``prefill_s``) and the job starts from it (each task
restores its key groups; the RocksDB backend ingests big blocks as sorted
SST files), then counts keys drawn uniformly at random. With
``--fill-through-job`` the job instead first reads every key once (a
permutation), as the first runs did (10M keys on RocksDB: 21 minutes on the
shared machine). ``--savepoint-cache DIR`` keeps the prefilled savepoint of
each key space in ``DIR`` and starts later runs from it (writing it takes
minutes at 10M keys and more). ``--early-flush`` sets
``RocksDBStateBackend(early_flush=...)``, ``--changelog``
``RocksDBStateBackend(changelog=...)`` (default: the backend's). The
measurement starts when the state is full, records flow and the first
checkpoint completed (it uploads the whole state restored from the
savepoint: nothing of it was uploaded before), and lasts ``--measure``
seconds. Reported:

- records/s while measuring;
- bytes written per checkpoint (state files, plus the shared files uploaded
  for that checkpoint: with incremental checkpoints, what changed), p50 and
  mean (without a changelog, a checkpoint after a compaction uploads its
  output too; with one, a checkpoint after a materialization uploads its new
  files), and the p50 per record counted;
- the changed data per checkpoint, estimated: the distinct keys that
  ``records_per_checkpoint`` uniformly random updates of ``keys`` keys touch,
  ``keys * (1 - exp(-updates / keys))``, times the bytes of one entry as
  RocksDB stores it (key and value, before compression; measured on sample
  keys); and the mean bytes per checkpoint over it (``mean_over_changed``;
  target: within 2x);
- checkpoint duration, synchronous part (the longest task's) and total
  (trigger to ``_metadata``), p50 and p99;
- peak resident memory (VmHWM) per keyed task;
- recovery: from the SIGKILL of a keyed task to every task of the next
  attempt running (state restored, records flowing), the job master's
  ``recovery_times``;
- ``start_s``: from the start of the job from the prefilled savepoint to
  records flowing (the savepoint restore of the full state);
- the load average (1 minute) at the start and the end of the measurement:
  the machine is shared.

Nothing is retained-deleted during the run (``retained`` is large), so the
bytes of each checkpoint can be read back from the storage afterwards.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from lockgate import CheckpointConfig, FixedDelayRestart, KeyedProcessFunction, Pipeline
from lockgate.checkpoint import storage
from lockgate.checkpoint.kinds import CheckpointKind, OperatorStateMode
from lockgate.checkpoint.metadata import CheckpointMetadata, OperatorMetadata, StateHandle
from lockgate.connectors import FileSink, SequenceSource
from lockgate.state.backend import ValueStateDescriptor
from lockgate.state.backends import RocksDBStateBackend
from lockgate.state.incremental import shared_checkpoint_id
from lockgate.state.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    key_group_for_key,
    key_group_range,
)
from lockgate.state.serde import StateSerializer

MIX = 0x9E3779B97F4A7C15


PARALLELISM = 2


def build(keys: int, total: int, backend: str, chk: str, out: str,
          prefilled: bool, extra: dict[str, Any] | None = None,
          rate: float | None = None) -> Pipeline:
    extra = extra or {}
    state: Any = "heap" if backend == "heap" else RocksDBStateBackend(memory_mb=256, **extra)
    p = Pipeline("bench-state", parallelism=PARALLELISM, state_backend=state,
                 checkpoint=CheckpointConfig(interval=2.0, storage=chk, retained=100_000,
                                             timeout=600.0, unaligned=True),
                 restart=FixedDelayRestart(max_attempts=3))
    stride = _coprime(keys)
    first = 0 if prefilled else keys

    def key_of(x: int) -> int:
        if x < first:
            return x * stride % keys  # a permutation: every key once
        return (((x * MIX) & 0xFFFFFFFFFFFFFFFF) >> 20) % keys

    (p.source(SequenceSource(0, total - 1, rate=rate), uid="numbers")
       .map(key_of, uid="keys")
       .key_by(lambda k: k)
       .process(Count(), uid="counts")
       .sink(FileSink(out), uid="out"))
    return p


class Count(KeyedProcessFunction):
    """The running count of each key, in a value state; emits nothing."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: int, ctx: Any) -> None:
        self.count.update(self.count.value() + 1)


def prefill(path: Path, keys: int) -> str:
    """A savepoint of the ``counts`` operator whose value state ``count``
    holds 1 for every key of ``range(keys)``, in the canonical format (one
    block per key group, ascending, per task of :data:`PARALLELISM`)."""
    m = DEFAULT_MAX_PARALLELISM
    groups: list[list[list[int]]] = [[] for _ in range(m)]
    for k in range(keys):
        groups[key_group_for_key(k, m)].append([k, 1])
    dumps = StateSerializer().dumps
    path.mkdir(parents=True)
    handles: list[StateHandle | None] = []
    for task in range(PARALLELISM):
        offsets: dict[int, tuple[int, int]] = {}

        def write(out: Any, task: int = task, offsets: dict[int, tuple[int, int]] = offsets
                  ) -> None:
            pos = 0
            for kg in key_group_range(task, PARALLELISM, m):
                if groups[kg]:
                    groups[kg].sort(key=lambda e: e[0])
                    blob = dumps([kg, {"count": groups[kg]}])
                    out.write(blob)
                    offsets[kg] = (pos, len(blob))
                    pos += len(blob)

        name = f"counts-{task}.state"
        size, crc = storage.write_state_file(str(path), name, write)
        handles.append(StateHandle(name, size, crc, 0, offsets, {"count": "value"}))
    storage.write_metadata(str(path), CheckpointMetadata(
        job_id="bench-state-prefill", checkpoint_id=0, kind=CheckpointKind.SAVEPOINT,
        timestamp=time.time(), final=False, max_parallelism=m,
        operators={"counts": OperatorMetadata(PARALLELISM, OperatorStateMode.SPLIT, handles)}))
    return str(path)


def _coprime(n: int) -> int:
    import math

    s = 2_654_435_761 % n or 1
    while math.gcd(s, n) != 1:
        s += 1
    return s


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def task_processes() -> dict[int, str]:
    """pid -> process name of this driver's tasks (``lgtask-<attempt>-<task>``)."""
    out = {}
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name.startswith("lgtask-"):
            out[pid] = name
    return out


class MemoryWatch(threading.Thread):
    """Peak VmHWM (MiB) per task process name, polled."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for pid, name in task_processes().items():
                try:
                    with open(f"/proc/{pid}/status") as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                mib = int(line.split()[1]) / 1024
                                self.peak[name] = max(self.peak.get(name, 0.0), mib)
                except OSError:
                    pass


def checkpoint_bytes(job_dir: Path) -> dict[int, int]:
    """Bytes written for each completed checkpoint: its folder's files and the
    shared files uploaded for it."""
    out: dict[int, int] = {}
    for chk in job_dir.glob("chk-*"):
        if (chk / "_metadata").exists():
            n = int(chk.name[4:])
            out[n] = sum(f.stat().st_size for f in chk.iterdir()
                         if not f.name.endswith(".channels"))  # in-flight records
    shared = job_dir / "shared"
    if shared.exists():
        for f in shared.iterdir():
            n = shared_checkpoint_id(f.name)
            if n in out:
                out[n] += f.stat().st_size
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else 0.0


def cached_prefill(cache: Path | None, tmp: Path, keys: int) -> tuple[str, float | None]:
    """The prefilled savepoint of ``keys`` keys and the seconds it took to
    write (None: reused from ``cache``)."""
    if cache is not None and (cache / f"keys-{keys}" / "_metadata").exists():
        return str(cache / f"keys-{keys}"), None
    t = time.monotonic()
    path = prefill(tmp / "prefill", keys)
    took = time.monotonic() - t
    if cache is None:
        return path, took
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"keys-{keys}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.move(path, target)
    return str(target), took


def entry_bytes(keys: int, count: int) -> float:
    """The mean bytes of one entry (RocksDB key and value) of the count
    state, before compression, over sample keys of ``range(keys)``."""
    from lockgate.state.rocksdb.tables import KeyCodec, state_id

    codec, dumps = KeyCodec(DEFAULT_MAX_PARALLELISM), StateSerializer().dumps
    sid = state_id("count")
    sample = range(0, keys, max(1, keys // 1000))
    sizes = [sum(map(len, codec.parts(k))) + len(sid) + len(dumps(count)) for k in sample]
    return sum(sizes) / len(sizes)


def measure(backend: str, keys: int, seconds: float, launcher: str,
            through_job: bool, cache: Path | None = None,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-bench-state-"))
    total = keys + 200_000_000
    prefill_s: float | None = 0.0
    savepoint = None
    if not through_job:
        savepoint, prefill_s = cached_prefill(cache, tmp, keys)
    p = build(keys, total, backend, str(tmp / "chk"), str(tmp / "out"), not through_job,
              extra)
    filled = keys if through_job else 1
    read = {"n": 0}
    full = threading.Event()
    marks: list[tuple[float, int, int]] = []

    def on_progress(pr: Any) -> None:
        read["n"] = pr.records_read
        marks.append((time.monotonic(), pr.records_read, pr.last_checkpoint_id or 0))
        if pr.records_read >= filled:
            full.set()

    watch = MemoryWatch()
    watch.start()
    started = time.monotonic()
    client = p.start(launcher=launcher, on_progress=on_progress, from_savepoint=savepoint)
    try:
        full.wait(3600)
        fill_s = time.monotonic() - started
        first = marks[-1][2]
        while marks[-1][2] <= first and time.monotonic() - started < 3600:
            time.sleep(0.05)  # the first checkpoint: the whole state uploaded
        load0 = os.getloadavg()[0]
        t0, n0, id0 = marks[-1]
        time.sleep(seconds)
        load1 = os.getloadavg()[0]
        t1, n1, id1 = marks[-1]
        victims = [pid for pid, name in task_processes().items()
                   if name.startswith("lgtask-0-") and name.endswith(("-2", "-3"))]
        killed = time.monotonic()
        if victims:
            os.kill(victims[0], signal.SIGKILL)
        before = len(marks)
        while len(marks) <= before and time.monotonic() - killed < 600:
            time.sleep(0.05)
        to_checkpoint = time.monotonic() - killed
        startup = getattr(getattr(client, "master", None), "startup", None)
        recovery_steps = startup.current.describe() if startup and startup.current else None
        result = client.cancel()
    finally:
        watch.stop.set()
    history = [dataclasses.asdict(c) for c in result.checkpoints if c.status == "completed"]
    window = [c for c in history if id0 < c["checkpoint_id"] <= id1]
    syncs = [c["sync_duration"] or 0.0 for c in window]
    totals = [c["duration"] or 0.0 for c in window]
    (job_dir,) = (tmp / "chk").iterdir()
    sizes = checkpoint_bytes(job_dir)
    written = [sizes[c["checkpoint_id"]] for c in window if c["checkpoint_id"] in sizes]
    keyed_peak = [v for k, v in watch.peak.items() if k.endswith(("-2", "-3"))]
    updates = (n1 - n0) / max(1, len(window))
    mean = sum(written) / len(written) if written else 0.0
    changed = keys * (1 - math.exp(-updates / keys)) * entry_bytes(
        keys, max(2, int((n1 + keys) / keys)))
    row = {
        "backend": backend, "keys": keys,
        "prefill_s": round(prefill_s, 1) if prefill_s is not None else "reused",
        **(extra or {}),
        ("fill_s" if through_job else "start_s"): round(fill_s, 1),
        "loadavg": [round(load0, 1), round(load1, 1)],
        "records_per_s": round((n1 - n0) / (t1 - t0)) if t1 > t0 else None,
        "checkpoints": len(window),
        "bytes_per_checkpoint_p50": int(pct(written, 0.5)),
        "bytes_per_checkpoint_mean": int(mean),
        "changed_bytes_per_checkpoint": int(changed),
        "mean_over_changed": round(mean / changed, 2) if changed else None,
        "records_per_checkpoint": round((n1 - n0) / max(1, len(window))),
        "bytes_per_record_p50": round(pct(written, 0.5) * len(window) / max(1, n1 - n0), 1),
        "sync_p50_ms": round(pct(syncs, 0.5) * 1000, 1),
        "sync_p99_ms": round(pct(syncs, 0.99) * 1000, 1),
        "total_p50_s": round(pct(totals, 0.5), 2), "total_p99_s": round(pct(totals, 0.99), 2),
        "peak_rss_mib": round(max(keyed_peak, default=0.0)),
        "recovery_s": round(result.recovery_times[0], 2) if result.recovery_times else None,
        "kill_to_next_checkpoint_s": round(to_checkpoint, 2),
        "recovery_steps": recovery_steps,
    }
    shutil.rmtree(tmp, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 10_000_000, 30_000_000])
    ap.add_argument("--backends", nargs="+", default=["heap", "rocksdb"])
    ap.add_argument("--measure", type=float, default=30.0)
    ap.add_argument("--launcher", default="local")
    ap.add_argument("--fill-through-job", action="store_true")
    ap.add_argument("--savepoint-cache", type=Path, default=None)
    ap.add_argument("--early-flush", choices=["on", "off"], default=None)
    ap.add_argument("--changelog", choices=["on", "off"], default=None)
    args = ap.parse_args()
    extra = {name: value == "on" for name, value in
             (("early_flush", args.early_flush), ("changelog", args.changelog))
             if value is not None}
    for keys in args.keys:
        for backend in args.backends:
            print(json.dumps(measure(backend, keys, args.measure, args.launcher,
                                     args.fill_through_job, args.savepoint_cache, extra)),
                  flush=True)


if __name__ == "__main__":
    main()
