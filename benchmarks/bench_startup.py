"""Time to first record and recovery time, with where the time goes.

    python benchmarks/bench_startup.py [--runs 3] [--kills 3] [--parallelism 2]
                                       [--launcher local|spark|both]

Each run is a fresh driver process (for Spark: a cold JVM and session). It
starts a rate-limited sums job (source -> key_by -> reduce -> map -> file sink;
parallelism 2 is 4 tasks) and measures

* **time to first record**: from ``Pipeline.start`` to the first record
  through the map after the reduce (it crossed a channel: records flow);
* **recovery**: ``--kills`` times, once the attempt runs and completed a
  checkpoint, a task is SIGKILLed (a different one each time) and the time
  from the kill to the first record of the next attempt is measured.

Each is broken down by the driver's and the tasks' start-up steps
(``JobMaster.startup``, :mod:`lockgate.cluster.startup`): a task step is the
slowest task's. Medians over every run and kill are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

RATE = 100_000


class FirstRecord:
    """The map after the reduce: writes the time of its first record (one
    file per task instance: a fresh copy is unpickled for every attempt)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.seen = False

    def __call__(self, x: Any) -> Any:
        if not self.seen:
            self.seen = True
            with open(os.path.join(self.folder, uuid.uuid4().hex), "w") as f:
                f.write(repr(time.time()))
        return x


def firsts(folder: Path) -> list[float]:
    times = []
    for f in folder.iterdir():
        try:
            times.append(float(f.read_text()))
        except ValueError:  # being written
            continue
    return times


def wait_first_after(folder: Path, after: float, timeout: float = 120.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        later = [t for t in firsts(folder) if t > after]
        if later:
            return min(later)
        time.sleep(0.005)
    raise TimeoutError("no record flowed")


def child(launcher: str, parallelism: int, kills: int) -> None:
    """One driver process: a cold start, then ``kills`` recoveries; JSON lines out."""
    started = time.time()
    from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
    from lockgate.connectors import FileSink, SequenceSource

    imported = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-startup-"))
    marks = tmp / "first"
    marks.mkdir()
    try:
        p = Pipeline("bench-startup", parallelism=parallelism,
                     checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp / "chk")),
                     restart=FixedDelayRestart(max_attempts=kills + 1))
        (p.source(SequenceSource(1, 10**12, rate=RATE), uid="numbers")
           .key_by(lambda x: x % 100)
           .reduce(lambda a, b: a + b, uid="sums")
           .map(FirstRecord(str(marks)), uid="first")
           .sink(FileSink(str(tmp / "out")), uid="out"))
        run = time.time()
        client = p.start(launcher=launcher, rest=False)
        first = wait_first_after(marks, run)
        master = client.master
        print(json.dumps({"kind": "cold", "launcher": launcher, "process": started,
                          "imported": imported, "run": run, "first": first,
                          "load": os.getloadavg()[0],
                          "timeline": timeline(master, 0)}), flush=True)
        for k in range(kills):
            attempt = master.attempt
            completed = master.coordinator.completed_count
            while master.coordinator.completed_count < completed + 1:
                time.sleep(0.005)
            pids = master.launcher.pids()
            victim = sorted(pids)[k % len(pids)]
            killed = time.time()
            if hasattr(master, "startup"):
                master.startup.mark("killed", killed)
            os.kill(pids[victim], signal.SIGKILL)
            first = wait_first_after(marks, killed)
            while master.attempt == attempt:
                time.sleep(0.005)
            print(json.dumps({"kind": "recovery", "launcher": launcher, "killed": killed,
                              "first": first, "task": victim,
                              "timeline": timeline(master, master.attempt)}), flush=True)
        client.cancel()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def timeline(master: Any, attempt: int) -> list[tuple[str, float]]:
    """The start-up steps of ``attempt`` once every task reported its own
    (nothing from a Lockgate that does not record them: a before-and-after run)."""
    startup = getattr(master, "startup", None)
    if startup is None:
        return []
    while startup.current is None or startup.current.attempt != attempt or \
            len(startup.current.tasks) < master.graph.num_tasks:
        time.sleep(0.005)
    return startup.current.timeline()  # type: ignore[no-any-return]


def phases(timeline: list[list[Any]], start: float, first: float) -> list[tuple[str, float]]:
    """Seconds between consecutive steps, from ``start`` to the first record."""
    line = sorted([("start", start)] + [(n, t) for n, t in timeline if t >= start]
                  + [("first record", first)], key=lambda step: step[1])
    return [(name, t - line[i - 1][1]) for i, (name, t) in enumerate(line) if i > 0]


def report(results: list[dict[str, Any]], launcher: str) -> None:
    for kind in ("cold", "recovery"):
        rows = [r for r in results if r["kind"] == kind and r["launcher"] == launcher]
        if not rows:
            continue
        start = "run" if kind == "cold" else "killed"
        totals = [r["first"] - r[start] for r in rows]
        steps: dict[str, list[float]] = defaultdict(list)
        order: list[str] = []
        for r in rows:
            for name, seconds in phases(r["timeline"], r[start], r["first"]):
                if name == start:
                    if kind != "cold":
                        continue
                    # Pipeline.start until the driver's first step: importing
                    # the driver's modules (lockgate.cluster)
                    name = "(imports)"
                steps[name].append(seconds)
                if name not in order:
                    order.append(name)
        what = "time to first record" if kind == "cold" else "recovery (SIGKILL -> records)"
        print(f"{launcher}: {what}: median {statistics.median(totals):.3f} s, "
              f"min {min(totals):.3f}, max {max(totals):.3f} ({len(totals)} runs)")
        if kind == "cold":
            before = [r["run"] - r["process"] for r in rows]
            print(f"    (before that: interpreter to Pipeline.start, imports "
                  f"{statistics.median(before):.3f} s)")
            loads = [r["load"] for r in rows if "load" in r]
            if loads:
                print(f"    (1-minute load average at each first record: "
                      f"{', '.join(f'{x:.1f}' for x in loads)}; each run: "
                      f"{', '.join(f'{t:.2f}' for t in totals)} s)")
        for name in order:
            print(f"    {name:<14} +{statistics.median(steps[name]) * 1000:7.1f} ms "
                  f"(median of {len(steps[name])})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--launcher", default="both", choices=["local", "spark", "both"])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.parallelism, args.kills)
        return
    launchers = ["local", "spark"] if args.launcher == "both" else [args.launcher]
    for launcher in launchers:
        results = []
        for _ in range(args.runs):
            out = subprocess.run(
                [sys.executable, __file__, "--child", launcher, "--kills", str(args.kills),
                 "--parallelism", str(args.parallelism)],
                stdout=subprocess.PIPE, text=True, check=True, timeout=900)
            results += [json.loads(line) for line in out.stdout.splitlines()
                        if line.startswith("{")]
        report(results, launcher)


if __name__ == "__main__":
    main()
