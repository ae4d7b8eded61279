"""The pause of a rescale: from the request to the first record processed at
the new parallelism, for W1 (the pipeline of ``bench_sums.py``: numbers ->
key_by(x % keys) -> reduce(sum) -> JSONL FileSink, exactly-once) and W2 (the
pipeline of ``bench_state.py``: a running count per key in a value state on
RocksDB, over uniformly random keys, every key of the key space in the state).

    python benchmarks/bench_rescale.py [--workload w1|w2] [--launcher local|spark|both]
                                       [--rounds 3] [--rate 200000] [--keys 1000]
                                       [--record] [--master 'local[6]']
                                       [--savepoint-cache DIR]

W2 (``--workload w2 --keys 1000000``): the job starts from a savepoint that
holds a count for every one of ``--keys`` keys, written offline as
``bench_state.py`` writes it (``--savepoint-cache DIR`` keeps it for later
runs), with ``RocksDBStateBackend(memory_mb=256)``, unaligned checkpoints
every 2 s, and its source rate-limited (``--rate``, default 30,000 records/s:
below what W2 processes on 2 tasks, so the rescale's aligned checkpoint does
not wait for a backlog). The keyed count notes, in every task, when its first
record passed: the pause ends at the first record counted at the new
parallelism, with the key groups that moved to it restored.

The job runs with a rate-limited unbounded source and a checkpoint every
second; each round rescales it up (2 -> 3) and down (3 -> 2) with
``JobClient.rescale``. A map after the keyed reduce notes, in every task
process, when its first record passed; the pause of a rescale is the first
such time after the request, minus the request's time. The rescale's own
answer (``seconds``: request to every task of the new parallelism running) is
printed too. ``--record`` appends a row per run to
``benchmarks/results/rescale.jsonl``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.record import record
from lockgate import CheckpointConfig, KeyedProcessFunction, Pipeline
from lockgate.connectors import FileSink, SequenceSource
from lockgate.state.backend import ValueStateDescriptor
from lockgate.state.backends import RocksDBStateBackend

RESULTS = Path(__file__).parent / "results" / "rescale.jsonl"


class FirstRecord:
    """Passes records on; notes the wall time of the first one in its task."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.done = False

    def __call__(self, x: Any) -> Any:
        if not self.done:
            self.done = True
            mark(self.folder)
        return x


def mark(folder: str) -> None:
    path = os.path.join(folder, f"{os.getpid()}-{time.time_ns()}")
    with open(path, "w") as f:
        f.write(repr(time.time()))


MIX = 0x9E3779B97F4A7C15  # as bench_state.py: the same keys


class MarkedCount(KeyedProcessFunction):
    """W2's running count per key; notes when its task counted its first record."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
        self.done = False

    def process_element(self, value: int, ctx: Any) -> None:
        if not self.done:
            self.done = True
            mark(self.folder)
        self.count.update(self.count.value() + 1)


def w1(tmp: Path, marks: Path, rate: float, keys: int) -> Pipeline:
    p = Pipeline("bench-rescale", parallelism=2,
                 checkpoint=CheckpointConfig(interval=1.0, storage=str(tmp / "chk")))
    (p.source(SequenceSource(1, None, rate=rate), uid="numbers")
       .key_by(lambda x: x % keys)
       .reduce(lambda a, b: a + b, uid="sums")
       .map(FirstRecord(str(marks)), uid="first")
       .sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out"))
    return p


def w2(tmp: Path, marks: Path, rate: float, keys: int) -> Pipeline:
    """W2 as ``bench_state.py`` builds it from its prefilled savepoint (the
    uids and the state's name match that savepoint's)."""
    p = Pipeline("bench-rescale-w2", parallelism=2,
                 state_backend=RocksDBStateBackend(memory_mb=256),
                 checkpoint=CheckpointConfig(interval=2.0, storage=str(tmp / "chk"),
                                             timeout=600.0, unaligned=True))

    def key_of(x: int) -> int:
        return (((x * MIX) & 0xFFFFFFFFFFFFFFFF) >> 20) % keys

    (p.source(SequenceSource(0, None, rate=rate), uid="numbers")
       .map(key_of, uid="keys")
       .key_by(lambda k: k)
       .process(MarkedCount(str(marks)), uid="counts")
       .sink(FileSink(str(tmp / "out")), uid="out"))
    return p


def steps(client: Any) -> str | None:
    """Where the new attempt's start went (the job master's startup log)."""
    startup = getattr(getattr(client, "master", None), "startup", None)
    return startup.current.describe() if startup and startup.current else None


def first_after(folder: Path, t: float, deadline: float = 60.0) -> float:
    """The first time noted in ``folder`` after ``t`` (waits for it)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        times = [float(p.read_text() or 0) for p in folder.iterdir()]
        later = [x for x in times if x > t]
        if later:
            return min(later)
        time.sleep(0.005)
    raise TimeoutError("no record was processed after the rescale")


def run(launcher: str, rounds: int, rate: float, keys: int,
        master: str = "local[6]", workload: str = "w1",
        cache: Path | None = None) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-bench-rescale-"))
    marks = tmp / "marks"
    marks.mkdir()
    try:
        savepoint = None
        if workload == "w2":
            from bench_state import cached_prefill

            savepoint, took = cached_prefill(cache, tmp, keys)
            if took is not None:
                print(f"wrote the savepoint of {keys} keys in {took:.1f} s", flush=True)
        p = (w2 if workload == "w2" else w1)(tmp, marks, rate, keys)
        done = threading.Event()
        checkpoints = [0]

        def progress(pr: Any) -> None:
            checkpoints[0] = pr.checkpoints_completed
            done.set()

        extra = {"master": master} if launcher == "spark" else {}
        started = time.monotonic()
        client = p.start(launcher=launcher, on_progress=progress, progress=False,
                         from_savepoint=savepoint, **extra)
        rows: list[dict[str, Any]] = []
        try:
            while checkpoints[0] < 1:  # W2: the whole restored state uploaded once
                done.wait(30)
                done.clear()
            print(f"{launcher:6s} {workload}: running, first checkpoint after "
                  f"{time.monotonic() - started:.1f} s", flush=True)
            for _ in range(rounds):
                for target in (3, 2):
                    seen = checkpoints[0]
                    while checkpoints[0] < seen + 2:  # records flow, checkpoints complete
                        done.wait(30)
                        done.clear()
                    asked = time.time()
                    load = os.getloadavg()[0]
                    answer = client.rescale(target)
                    first = first_after(marks, asked, 600.0)
                    chk = next((h for h in client.checkpoints()
                                if h["id"] == answer.get("checkpoint_id")), {})
                    rows.append({"launcher": launcher, **extra, "from": 5 - target, "to": target,
                                 "pause_s": round(first - asked, 3),
                                 "tasks_running_s": round(answer["seconds"], 3),
                                 "checkpoint_s": round(chk.get("duration") or 0.0, 3),
                                 "checkpoint_bytes": chk.get("size"),
                                 "load": round(load, 2), "steps": steps(client)})
                    print(f"{launcher:6s} {5 - target} -> {target}: pause "
                          f"{first - asked:.3f} s (tasks running after "
                          f"{answer['seconds']:.3f} s; the rescale's checkpoint "
                          f"{rows[-1]['checkpoint_s']:.3f} s, {chk.get('size')} bytes; "
                          f"load {load:.1f})\n    {rows[-1]['steps']}", flush=True)
        finally:
            client.cancel()
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="w1", choices=["w1", "w2"])
    ap.add_argument("--launcher", default="both", choices=["local", "spark", "both"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=None,
                    help="records/s of the source (W1: 200,000; W2: 30,000)")
    ap.add_argument("--keys", type=int, default=None,
                    help="the key space (W1: 1,000; W2: 1,000,000, all in the state)")
    ap.add_argument("--master", default="local[6]", help="Spark's master (local[6])")
    ap.add_argument("--savepoint-cache", type=Path, default=None,
                    help="W2: keep the prefilled savepoint of each key space here")
    ap.add_argument("--record", action="store_true", help=f"append the runs to {RESULTS}")
    args = ap.parse_args()
    w2 = args.workload == "w2"
    if args.rate is None:
        args.rate = 30_000 if w2 else 200_000
    if args.keys is None:
        args.keys = 1_000_000 if w2 else 1000
    launchers = ["local", "spark"] if args.launcher == "both" else [args.launcher]
    for launcher in launchers:
        rows = run(launcher, args.rounds, args.rate, args.keys, args.master, args.workload,
                   args.savepoint_cache)
        for direction in ("up", "down"):
            pauses = [r["pause_s"] for r in rows if (r["to"] > r["from"]) == (direction == "up")]
            print(f"{launcher:6s} {direction:4s}: median pause {statistics.median(pauses):.3f} s, "
                  f"max {max(pauses):.3f} s over {len(pauses)} rescales", flush=True)
        if args.record:
            record("rescale", [{"workload": "W2 rescale (RocksDB)" if w2 else "W1 rescale",
                                "rate": args.rate, "keys": args.keys, **r} for r in rows])


if __name__ == "__main__":
    main()
