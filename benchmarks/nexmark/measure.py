"""What the Nexmark runner measures besides wall time.

* ``StatsSink``: counts a query's results and, in the latency runs, the
  wall clock at the sink minus each result's event time (``result_time``),
  written by each task to ``<folder>/<uid>-<task>.json`` when its input ends.
  Not transactional (the job says at-least-once): it keeps nothing.
* ``JobUsage``: CPU seconds of every process of the job (the driver, the
  fork server, the tasks), its CPU over time, and the tasks' peak memory.
* ``steady``: the rate and the rate per CPU second between two points of the
  sources' progress (start-up and the end left out).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.nexmark.queries import result_time
from lockgate.cluster.interrupt import descendants
from lockgate.connectors.base import Sink, SinkWriter, TaskInfo
from lockgate.runtime.spec import TASK_PROCESS_PREFIX

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class StatsSink(Sink[Any]):
    def __init__(self, query: str, folder: str, *, latency: bool, warmup_until: int = 0,
                 last_event: int | None = None) -> None:
        self.query, self.folder, self.latency = query, folder, latency
        self.warmup_until = warmup_until
        """Results of event time before this (ms) are counted, not timed."""
        self.last_event = last_event
        """Results of event time after this (ms) are counted, not timed: the
        windows and sessions the end of the input closes, not time."""

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
            last = self.sink.last_event if self.sink.last_event is not None else float("inf")
            for r in batch:
                t = result_time(q, r)
                if warm <= t <= last:
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


def _stat(pid: int) -> tuple[str, float, float, int, int, int] | None:
    """``(name, own CPU s, CPU s of its reaped children, RSS bytes, parent
    pid, start time in clock ticks)`` of ``pid``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    return (name, (int(fields[11]) + int(fields[12])) / _TICK,
            (int(fields[13]) + int(fields[14])) / _TICK, int(fields[21]) * _PAGE,
            int(fields[1]), int(fields[19]))


class JobUsage(threading.Thread):
    """CPU seconds of every process of a job run from this process (the
    driver): the driver itself, the fork server and the tasks (and, on Spark,
    its JVM and Python workers), from ``/proc`` and ``os.times``.

    A snapshot adds the driver's own CPU (less this sampling thread's), the
    CPU of its reaped children, and of every live descendant its own and its
    reaped children's: a task that ended is in its parent's (the fork
    server's) reaped-children figure from then on, so nothing is lost or
    counted twice. A descendant orphaned by its parent's death (as a Spark
    daemon's workers can be) is followed on by its pid, and one that ended
    with nobody tracked to reap it (an orphan, or a process of an earlier
    run ending now) keeps the CPU it was last seen with: without that, a
    run's figure could even come out negative. So does one whose parent
    ignores SIGCHLD (Spark's Python daemon: the kernel reaps its workers,
    and their CPU never reaches its reaped-children figure). ``finish`` takes the last
    snapshot after the tasks are reaped; the CPU of the run is the
    difference of the first and the last. Every 50 ms a sample ``(wall
    clock, CPU so far)`` goes to ``timeline`` (the steady-state figures),
    and the peak of the summed RSS of the tasks (processes named
    ``lgtask-...``) is kept; ``tasks`` keeps each task's last CPU sample (at
    most 50 ms old when it ended)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.timeline: list[tuple[float, float]] = []
        self.tasks: dict[int, float] = {}
        self.peak_rss = 0
        self.stop = threading.Event()
        self.own = 0.0
        """CPU seconds of this thread (not the job's)."""
        self.seen: dict[int, tuple[float, int, int, float]] = {}
        """Per process followed at the last snapshot: its CPU (own and reaped
        children's), its parent, its start time and its reaped children's CPU."""
        self.gone = 0.0
        """CPU seconds of descendants that vanished with no tracked parent."""
        self.base = self.snapshot()

    def snapshot(self) -> float:
        t = os.times()
        total = t.user + t.system - self.own + t.children_user + t.children_system
        rss = 0
        me = os.getpid()
        alive: dict[int, tuple[float, int, int, float]] = {}
        for pid in [*descendants(me), *self.seen]:
            if pid in alive or (st := _stat(pid)) is None:
                continue
            name, cpu, reaped, mem, parent, start = st
            if pid in self.seen and start != self.seen[pid][2]:
                continue  # the pid was reused
            alive[pid] = (cpu + reaped, parent, start, reaped)
            total += cpu + reaped
            if name.startswith(TASK_PROCESS_PREFIX):
                self.tasks[pid] = cpu
                rss += mem
        vanished: dict[int, float] = {}  # per live parent: its children gone since
        for pid, (cpu, parent, _, _) in self.seen.items():
            if pid in alive:
                continue
            if parent not in alive and parent != me:
                self.gone += cpu  # nobody tracked reaped it: its last figure
            elif parent in alive and parent in self.seen:
                vanished[parent] = vanished.get(parent, 0.0) + cpu
        for parent, cpu in vanished.items():
            # A parent that ignores SIGCHLD (Spark's Python daemon) has its
            # children reaped by the kernel, their CPU never added to its
            # reaped-children figure: what that figure did not grow by is
            # kept, at the children's last figures.
            self.gone += max(0.0, cpu - (alive[parent][3] - self.seen[parent][3]))
        self.seen = alive
        total += self.gone
        self.peak_rss = max(self.peak_rss, rss)
        return total

    def run(self) -> None:
        while not self.stop.wait(0.05):
            begin = time.thread_time()
            self.timeline.append((time.time(), self.snapshot() - self.base))
            self.own += time.thread_time() - begin

    def finish(self, settle: float = 5.0) -> dict[str, float]:
        """Stop sampling once no task process is left (at most ``settle``
        seconds): CPU seconds of the whole job (``cpu_s``), of the driver
        (``driver_cpu_s``), of the tasks (``tasks_cpu_s``), and the peak
        RSS of the tasks in bytes (``peak_rss``)."""
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and any(
                (st := _stat(pid)) is not None and st[0].startswith(TASK_PROCESS_PREFIX)
                for pid in descendants(os.getpid())):
            time.sleep(0.02)
        self.stop.set()
        self.join()
        total = self.snapshot() - self.base
        self.timeline.append((time.time(), total))
        t = os.times()
        return {"cpu_s": total, "driver_cpu_s": t.user + t.system - self.own - self._driver0,
                "tasks_cpu_s": sum(self.tasks.values()), "peak_rss": self.peak_rss}

    def start(self) -> None:
        t = os.times()
        self._driver0 = t.user + t.system - self.own
        self.base = self.snapshot()
        self.tasks.clear()
        self.peak_rss = 0
        super().start()


def steady(marks: list[tuple[float, int]], timeline: list[tuple[float, float]], events: int,
           lo: float = 0.2, hi: float = 0.8) -> dict[str, float | None]:
    """Events/s and events per CPU second between the moments the sources
    had read ``lo`` and ``hi`` of ``events`` (``marks``: the sources' summed
    progress, ``timeline``: the job's CPU so far), start-up and the last
    stragglers left out."""
    a, b = _when(marks, lo * events), _when(marks, hi * events)
    if a is None or b is None or b <= a:
        return {"steady_events_per_s": None, "steady_events_per_core_s": None}
    n = (hi - lo) * events
    ca, cb = _at(timeline, a), _at(timeline, b)
    return {"steady_events_per_s": n / (b - a),
            "steady_events_per_core_s": n / (cb - ca) if cb > ca else None}


def _when(marks: list[tuple[float, int]], count: float) -> float | None:
    """The wall clock at which ``count`` events were read (linear between marks)."""
    for (t0, c0), (t1, c1) in zip(marks, marks[1:], strict=False):
        if c0 <= count <= c1:
            return t0 if c1 == c0 else t0 + (t1 - t0) * (count - c0) / (c1 - c0)
    return None


def _at(timeline: list[tuple[float, float]], t: float) -> float:
    """The CPU seconds at wall clock ``t`` (linear between samples)."""
    for (t0, c0), (t1, c1) in zip(timeline, timeline[1:], strict=False):
        if t0 <= t <= t1:
            return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)
    return timeline[-1][1] if timeline and t > timeline[-1][0] else 0.0


def source_progress(folder: str) -> list[tuple[float, int]]:
    """The sources' progress files summed: ``[(wall clock, events read by all)]``."""
    per_task = [json.loads(f.read_text()) for f in Path(folder).glob("source-*.json")]
    times = sorted({t for marks in per_task for t, _ in marks})
    out = []
    for t in times:
        total = 0.0
        for marks in per_task:
            total += _count_at(marks, t)
        out.append((t, int(total)))
    return out


def _count_at(marks: list[list[float]], t: float) -> float:
    if t <= marks[0][0]:
        return 0.0
    for (t0, c0), (t1, c1) in zip(marks, marks[1:], strict=False):
        if t0 <= t <= t1:
            return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
    return float(marks[-1][1])
