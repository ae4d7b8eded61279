"""What the Nexmark runner measures besides wall time.

* ``StatsSink``: counts a query's results and, in the latency runs, the
  wall clock at the sink minus each result's event time (``result_time``),
  written by each task to ``<folder>/<uid>-<task>.json`` when its input ends.
  Not transactional (the job says at-least-once): it keeps nothing.
* ``TaskUsage``: CPU seconds and peak memory of the job's task processes
  (the driver's descendants named ``lgtask-...``), sampled from ``/proc``
  every 20 ms while the job runs; a process's last CPU sample is at most 20 ms
  old when it ends.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.nexmark.queries import result_time
from lockgate.connectors.base import Sink, SinkWriter, TaskInfo
from lockgate.runtime.spec import TASK_PROCESS_PREFIX

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class StatsSink(Sink[Any]):
    def __init__(self, query: str, folder: str, *, latency: bool, warmup_until: int = 0) -> None:
        self.query, self.folder, self.latency = query, folder, latency
        self.warmup_until = warmup_until
        """Results of event time before this (ms) are counted, not timed."""

    def create_writer(self, info: TaskInfo) -> SinkWriter[Any]:
        return _StatsWriter(self, info)


class _StatsWriter(SinkWriter[Any]):
    def __init__(self, sink: StatsSink, info: TaskInfo) -> None:
        self.sink, self.info = sink, info
        self.count = 0
        self.latencies: list[int] = []

    def restore(self, state: list[Any]) -> None:
        pass

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return []

    def write_batch(self, batch: list[Any]) -> None:
        self.count += len(batch)
        if self.sink.latency:
            now = int(time.time() * 1000)
            q, warm = self.sink.query, self.sink.warmup_until
            for r in batch:
                t = result_time(q, r)
                if t >= warm:
                    self.latencies.append(now - t)

    def finish(self) -> None:
        path = Path(self.sink.folder) / f"{self.info.uid}-{self.info.task_index}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"count": self.count, "latencies": self.latencies}))


def read_stats(folder: str) -> tuple[int, list[int]]:
    """Results and latency samples (ms) of every task's file in ``folder``."""
    count, latencies = 0, []
    for f in Path(folder).glob("*.json"):
        d = json.loads(f.read_text())
        count += d["count"]
        latencies += d["latencies"]
    return count, latencies


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (the machine is shared: only this job's tasks)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    children = {int(c) for c in f.read().split()}
            except OSError:
                continue
            todo.extend(children - found)
            found |= children
    return found


class TaskUsage(threading.Thread):
    """CPU seconds and the peak of the summed RSS of this job's task processes."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.cpu: dict[int, float] = {}
        self.peak_rss = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.02):
            self.sample()

    def sample(self) -> None:
        rss = 0
        for pid in _descendants(os.getpid()):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            if not name.startswith(TASK_PROCESS_PREFIX):
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            self.cpu[pid] = (int(fields[11]) + int(fields[12])) / _TICK
            rss += int(fields[21]) * _PAGE
        self.peak_rss = max(self.peak_rss, rss)

    def finish(self) -> tuple[float, int]:
        """Stop sampling: (CPU seconds of all tasks, peak total RSS in bytes)."""
        self.stop.set()
        self.join()
        return sum(self.cpu.values()), self.peak_rss
