"""The pause of a rescale: from the request to the first record processed at
the new parallelism, for W1 (the pipeline of ``bench_sums.py``: numbers ->
key_by(x % keys) -> reduce(sum) -> JSONL FileSink, exactly-once).

    python benchmarks/bench_rescale.py [--launcher local|spark|both] [--rounds 3]
                                       [--rate 200000] [--keys 1000] [--record]
                                       [--master 'local[6]']

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
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, SequenceSource

RESULTS = Path(__file__).parent / "results" / "rescale.jsonl"


class FirstRecord:
    """Passes records on; notes the wall time of the first one in its task."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.done = False

    def __call__(self, x: Any) -> Any:
        if not self.done:
            self.done = True
            path = os.path.join(self.folder, f"{os.getpid()}-{time.time_ns()}")
            with open(path, "w") as f:
                f.write(repr(time.time()))
        return x


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
        master: str = "local[6]") -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-bench-rescale-"))
    marks = tmp / "marks"
    marks.mkdir()
    try:
        p = Pipeline("bench-rescale", parallelism=2,
                     checkpoint=CheckpointConfig(interval=1.0, storage=str(tmp / "chk")))
        (p.source(SequenceSource(1, None, rate=rate), uid="numbers")
           .key_by(lambda x: x % keys)
           .reduce(lambda a, b: a + b, uid="sums")
           .map(FirstRecord(str(marks)), uid="first")
           .sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out"))
        done = threading.Event()
        checkpoints = [0]

        def progress(pr: Any) -> None:
            checkpoints[0] = pr.checkpoints_completed
            done.set()

        extra = {"master": master} if launcher == "spark" else {}
        client = p.start(launcher=launcher, on_progress=progress, progress=False, **extra)
        rows = []
        try:
            for _ in range(rounds):
                for target in (3, 2):
                    seen = checkpoints[0]
                    while checkpoints[0] < seen + 2:  # records flow, checkpoints complete
                        done.wait(30)
                        done.clear()
                    asked = time.time()
                    answer = client.rescale(target)
                    first = first_after(marks, asked)
                    rows.append({"launcher": launcher, **extra, "from": 5 - target, "to": target,
                                 "pause_s": round(first - asked, 3),
                                 "tasks_running_s": round(answer["seconds"], 3)})
                    print(f"{launcher:6s} {5 - target} -> {target}: pause "
                          f"{first - asked:.3f} s (tasks running after "
                          f"{answer['seconds']:.3f} s)", flush=True)
        finally:
            client.cancel()
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", default="both", choices=["local", "spark", "both"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=200_000, help="records/s of the source")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--master", default="local[6]", help="Spark's master (local[6])")
    ap.add_argument("--record", action="store_true", help=f"append the runs to {RESULTS}")
    args = ap.parse_args()
    launchers = ["local", "spark"] if args.launcher == "both" else [args.launcher]
    for launcher in launchers:
        rows = run(launcher, args.rounds, args.rate, args.keys, args.master)
        for direction in ("up", "down"):
            pauses = [r["pause_s"] for r in rows if (r["to"] > r["from"]) == (direction == "up")]
            print(f"{launcher:6s} {direction:4s}: median pause {statistics.median(pauses):.3f} s, "
                  f"max {max(pauses):.3f} s over {len(pauses)} rescales", flush=True)
        if args.record:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, cwd=Path(__file__).parent).stdout.strip()
            load = os.getloadavg()[0]
            with open(RESULTS, "a") as f:
                for r in rows:
                    f.write(json.dumps({
                        "date": time.strftime("%Y-%m-%d"), "commit": commit,
                        "machine": f"{os.cpu_count()}-core ({platform.node()})",
                        "load": round(load, 2), "workload": "W1 rescale",
                        "rate": args.rate, "keys": args.keys, **r}) + "\n")


if __name__ == "__main__":
    main()
