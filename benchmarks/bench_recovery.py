"""Recovery time: from a task's SIGKILL to every task of the next attempt running.

    python benchmarks/bench_recovery.py [--kills 5] [--parallelism 2] [--launcher local|spark|both]
    python benchmarks/bench_recovery.py --large [--keys 10000000] [--storage local s3]
        [--kills 3] [--savepoint-cache DIR] [--record]

Without ``--large``: a rate-limited sums job (small state) whose tasks kill
themselves (SIGKILL) once per attempt, right after a checkpoint was
acknowledged; prints the time from the failure's detection to records
flowing again, per restart. Detection of a SIGKILL is immediate: the kernel
closes the dead task's sockets.

``--large``: recovery of large RocksDB state with and without local
recovery (``RocksDBStateBackend(local_recovery=...)``). W2's job (a keyed
running count, 2 tasks, ``bench_state.py``) starts from a savepoint holding
``--keys`` keys (written offline, cached with ``--savepoint-cache``), counts
random keys at ``--rate`` records/s with a checkpoint every 2 s (the
changelog: the state's files are uploaded once, then the changes), and once
two checkpoints completed, a keyed task is SIGKILLed ``--kills`` times, each
after the next attempt completed a checkpoint. Per kill: ``recovery_s``,
the job master's time from the failure to every task running again, and
``restore_s``, the slowest keyed task's restore of its state (from its
control connection to its state restored: the local copy checked and linked
in, or the files read from the checkpoint storage, and the changelog
applied). Checkpoint storage: ``local`` (a folder on the same disk as the
tasks' databases: a restore hard-links the checked files from it already)
and ``s3`` (a moto S3 server process on loopback: each file is downloaded).
``--record`` appends a row per kill to ``benchmarks/results/recovery.jsonl``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.record import record
from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.connectors import FileSink, SequenceSource

RESULTS = Path(__file__).parent / "results" / "recovery.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=None)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--launcher", default="both", choices=["local", "spark", "both"])
    ap.add_argument("--large", action="store_true",
                    help="large RocksDB state, with and without local recovery")
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--storage", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    ap.add_argument("--rate", type=float, default=20_000, help="records/s (--large)")
    ap.add_argument("--savepoint-cache", type=Path, default=None)
    ap.add_argument("--record", action="store_true", help=f"append the runs to {RESULTS}")
    args = ap.parse_args()
    if args.large:
        large(args)
        return
    for launcher in ["local", "spark"] if args.launcher == "both" else [args.launcher]:
        measure(launcher, args.kills or 5, args.parallelism)


def measure(launcher: str, kills: int, parallelism: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-recovery-"))
    try:
        p = Pipeline("bench-recovery", parallelism=parallelism,
                     checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp / "chk")),
                     restart=FixedDelayRestart(max_attempts=kills + 1))
        (p.source(SequenceSource(1, 400_000, rate=200_000), uid="numbers")
           .key_by(lambda x: x % 100)
           .reduce(lambda a, b: a + b, uid="sums")
           .sink(FileSink(str(tmp / "out")), uid="out"))
        faults = [{"point": "acked", "task": a % (2 * parallelism), "attempt": a,
                   "count": 2} for a in range(kills)]
        if launcher == "spark":  # measured on a warm session: start it first
            warm = Pipeline("warm-up", parallelism=parallelism,
                            checkpoint=CheckpointConfig(storage=str(tmp / "warm")))
            warm.source(SequenceSource(1, 10), uid="n").rebalance().sink(
                FileSink(str(tmp / "warm-out")), uid="o")
            warm.run(launcher="spark")
        result = p.run(launcher=launcher, fault_injection=faults)
        times = result.recovery_times
        print(f"{launcher} p={parallelism}: {len(times)} recoveries, "
              f"median {statistics.median(times):.2f} s, max {max(times):.2f} s "
              f"(from a task's SIGKILL to every task of the next attempt running)", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------- large state

class MotoServer:
    """A moto S3 server in its own process on loopback, and a bucket."""

    KEY, SECRET = "bench", "bench-secret"

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        exe = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
        self.proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import boto3

        self.client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.port}",
                                   aws_access_key_id=self.KEY,
                                   aws_secret_access_key=self.SECRET, region_name="us-east-1")
        deadline = time.monotonic() + 30
        while True:
            try:
                self.bucket = f"bench-{uuid.uuid4().hex[:8]}"
                self.client.create_bucket(Bucket=self.bucket)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def url(self, prefix: str) -> str:
        return (f"s3://{self.KEY}:{self.SECRET}@{self.bucket}/{prefix}"
                f"?endpoint_override=127.0.0.1:{self.port}&scheme=http&region=us-east-1")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def keyed_restore_s(steps: dict[int, dict[str, float]], tasks: list[int]) -> float | None:
    """The slowest keyed task's restore: from its control connection to its
    state restored (the task's steps ``connected`` and ``restored``)."""
    spans = [s["restored"] - s["connected"] for t, s in steps.items()
             if t in tasks and "restored" in s and "connected" in s]
    return max(spans) if spans else None


def large_run(keys: int, storage_kind: str, local_recovery: bool, kills: int, rate: float,
              savepoint: str, s3: MotoServer | None) -> list[dict[str, Any]]:
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_state  # a sibling script: W2's job and its prefilled savepoint

    tmp = Path(tempfile.mkdtemp(prefix="lockgate-bench-recovery-"))
    try:
        chk = (s3.url(f"chk-{uuid.uuid4().hex[:6]}") if storage_kind == "s3" and s3
               else str(tmp / "chk"))
        p = bench_state.build(keys, keys + 500_000_000, "rocksdb", chk, str(tmp / "out"),
                              prefilled=True, extra={"local_recovery": local_recovery},
                              rate=rate)
        p.restart = FixedDelayRestart(max_attempts=kills + 1)
        completed = {"n": 0}
        event = threading.Event()

        def on_progress(pr: Any) -> None:
            completed["n"] = pr.checkpoints_completed
            event.set()

        def await_checkpoints(n: int, timeout: float = 1800) -> None:
            deadline = time.monotonic() + timeout
            while completed["n"] < n:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{n} checkpoints did not complete")
                event.wait(1)
                event.clear()

        client = p.start(launcher="local", on_progress=on_progress, from_savepoint=savepoint,
                         progress=False)
        rows = []
        try:
            await_checkpoints(2)  # the first uploads the whole state
            master = client.master
            for kill in range(kills):
                attempt = master.attempt
                victims = [pid for pid, name in bench_state.task_processes().items()
                           if name == f"lgtask-{attempt}-2"]
                seen = completed["n"]
                load = os.getloadavg()[0]
                os.kill(victims[0], signal.SIGKILL)
                await_checkpoints(seen + 2)  # the next attempt runs and checkpoints
                steps = master.startup.attempts[-1].tasks
                rows.append({
                    "kill": kill + 1, "load": round(load, 2),
                    "recovery_s": round(master.recovery_times[-1], 3),
                    "restore_s": round(keyed_restore_s(steps, [2, 3]) or 0.0, 3),
                    "local_used": [r.local for r in master.local_restores
                                   if r.attempt == master.attempt],
                })
                print(f"{storage_kind:5s} local_recovery={local_recovery!s:5s} kill {kill + 1}: "
                      f"recovery {rows[-1]['recovery_s']:.3f} s, restore "
                      f"{rows[-1]['restore_s']:.3f} s, local {rows[-1]['local_used']}",
                      flush=True)
        finally:
            result = client.cancel()
        state = _state_bytes(result.latest_checkpoint)
        for r in rows:
            r["state_mib"] = round(state / 2**20, 1)
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _state_bytes(latest: str | None) -> int:
    """Bytes of the keyed state the latest checkpoint names (its files)."""
    if latest is None:
        return 0
    from lockgate.checkpoint import storage

    meta = storage.read_metadata(latest)
    return sum(h.incremental.size for _, h in meta.state_files() if h.incremental is not None)


def large(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_state

    tmp = Path(tempfile.mkdtemp(prefix="lockgate-bench-recovery-sp-"))
    s3 = MotoServer() if "s3" in args.storage else None
    kills = args.kills or 3
    try:
        savepoint, _ = bench_state.cached_prefill(args.savepoint_cache, tmp, args.keys)
        for storage_kind in args.storage:
            for local_recovery in (True, False):
                rows = large_run(args.keys, storage_kind, local_recovery, kills, args.rate,
                                 savepoint, s3)
                for what in ("recovery_s", "restore_s"):
                    values = [r[what] for r in rows]
                    print(f"{storage_kind:5s} local_recovery={local_recovery!s:5s}: {what} "
                          f"median {statistics.median(values):.3f} s, "
                          f"max {max(values):.3f} s", flush=True)
                if args.record:
                    record("recovery", [{"workload": "W2 recovery", "keys": args.keys,
                                         "backend": "rocksdb", "storage": storage_kind,
                                         "local_recovery": local_recovery, "rate": args.rate,
                                         **r} for r in rows])
    finally:
        if s3 is not None:
            s3.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
