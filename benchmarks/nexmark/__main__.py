"""The Nexmark runner::

    python3 -m benchmarks.nexmark [--queries q0,q1,...] [--events 300000]
                                  [--event-rate 10000] [--parallelism 2] [--latency-rate 4000]
                                  [--latency-seconds 15] [--launcher local]

Per query, two runs of a job with one source and the query:

1. throughput: ``--events`` events as fast as the job goes, windows of 10 s
   (sliding every 2 s for q5) as in Flink's Nexmark, ``--event-rate`` events
   per second of event time (10 000 by default; Flink's Nexmark generates 10
   million, so each window holds 1000 times more events), a checkpoint every
   10 s. Reported: events/s of wall time and events/s per core = events / CPU
   seconds of every process of the job: the driver (this process, less its
   sampling thread), the fork server and the tasks (what Flink's Nexmark
   reports as throughput/cores, from the CPU of its whole cluster), over the
   whole run and in the steady state: between the moments the sources had
   read 20 % and 80 % of the events (start-up, the first batches and the end
   left out); the CPU seconds of the driver and of the tasks apart; peak
   memory = the largest sum of the tasks' RSS. CPU seconds hardly depend on
   what else runs on the machine, wall time does: on a loaded machine the
   per-core figures are the ones to compare. A job of 20,000 events runs
   first, not measured: the driver's imports and the local launcher's fork
   server are ready before the first query (as a Flink cluster's
   TaskManagers run before its jobs); the fork server's work for each job
   (forking and reaping its tasks) is counted.
2. latency: the source paced by event time at ``--latency-rate`` events/s
   (an event leaves the source when the wall clock reaches its time), windows
   of 2 s (sliding every 0.5 s) so that enough of them fire; reported: the
   p50 and p99 of (wall clock at the sink - the result's event time: its
   event's time, or its window's end), over the results after the first 3 s
   and before the last event (what the end of the input fires is left out);
   not for the queries whose results come at the end of the input (q15-q19).

Prints a Markdown table (``--json`` for the raw numbers).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.nexmark.generator import GeneratorConfig
from benchmarks.nexmark.job import QUERIES, build
from benchmarks.nexmark.measure import JobUsage, StatsSink, read_stats, source_progress, steady
from benchmarks.nexmark.queries import Windows

AT_THE_END = {"q15", "q16", "q17", "q18", "q19"}
"""Queries whose results come at the end of the input (daily windows, the
final last or top bids): no latency run."""
WARMUP_MS = 3_000
STARTUP_MS = 3_000
"""The latency run's event time starts this long after the job is built."""


def throughput(query: str, events: int, parallelism: int, launcher: str,
               event_rate: int = GeneratorConfig.rate) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-nexmark-"))
    try:
        p = build([query], events,
                  lambda q: StatsSink(q, str(tmp / "stats"), latency=False),
                  parallelism=parallelism, config=GeneratorConfig(rate=event_rate),
                  storage=str(tmp / "chk"), interval=10.0, progress=str(tmp / "progress"))
        usage = JobUsage()
        usage.start()
        t0 = time.perf_counter()
        result = p.run(launcher=launcher, rest=False, progress=False)
        wall = time.perf_counter() - t0
        cpu = usage.finish()
        count, _ = read_stats(str(tmp / "stats"))
        row = {"status": str(result.status), "wall_s": wall, "events_per_s": events / wall,
               "cpu_s": cpu["cpu_s"], "driver_cpu_s": cpu["driver_cpu_s"],
               "tasks_cpu_s": cpu["tasks_cpu_s"],
               "events_per_core_s": events / cpu["cpu_s"] if cpu["cpu_s"] else None,
               "peak_rss_mb": cpu["peak_rss"] / 2**20, "results": count}
        row.update(steady(source_progress(str(tmp / "progress")), usage.timeline, events))
        return row
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def latency(query: str, rate: int, seconds: float, parallelism: int,
            launcher: str) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-nexmark-"))
    try:
        base = int(time.time() * 1000) + STARTUP_MS
        config = GeneratorConfig(rate=rate, base_time=base)
        p = build([query], int(rate * seconds),
                  lambda q: StatsSink(q, str(tmp / "stats"), latency=True,
                                      warmup_until=base + WARMUP_MS,
                                      last_event=config.timestamp(int(rate * seconds) - 1)),
                  parallelism=parallelism, config=config, windows=Windows(2_000, 500),
                  paced=True, storage=str(tmp / "chk"), interval=10.0)
        p.run(launcher=launcher, rest=False, progress=False)
        _, samples = read_stats(str(tmp / "stats"))
        if len(samples) < 2:
            return {"p50_ms": None, "p99_ms": None, "samples": len(samples)}
        q = statistics.quantiles(samples, n=100, method="inclusive")
        return {"p50_ms": statistics.median(samples), "p99_ms": q[98], "samples": len(samples)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", default=",".join(QUERIES))
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--latency-rate", type=int, default=4_000)
    ap.add_argument("--latency-seconds", type=float, default=15.0)
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    ap.add_argument("--event-rate", type=int, default=GeneratorConfig.rate,
                    help="events per second of event time in the throughput runs "
                         "(Flink's Nexmark: 10000000, so its windows hold 1000x more)")
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # not measured: the driver's imports and the local launcher's fork server
    # are ready before the first query, as a Flink cluster's TaskManagers are
    throughput("q0", 20_000, args.parallelism, args.launcher)
    rows = {}
    for q in args.queries.split(","):
        row = throughput(q, args.events, args.parallelism, args.launcher, args.event_rate)
        if not args.no_latency and q not in AT_THE_END:
            row.update(latency(q, args.latency_rate, args.latency_seconds, args.parallelism,
                               args.launcher))
        rows[q] = row
        print(f"# {q}: {json.dumps(row)}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("\n| query | events/s, steady / whole run | events/s per core, steady / whole run "
          "| CPU s: all (driver, tasks) | peak RSS (MB) | latency p50 / p99 (ms) | results |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for q, r in rows.items():
        lat = (f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f}" if r.get("p50_ms") is not None
               else "-")
        print(f"| {q} | {_n(r['steady_events_per_s'])} / {_n(r['events_per_s'])} | "
              f"{_n(r['steady_events_per_core_s'])} / {_n(r['events_per_core_s'])} | "
              f"{r['cpu_s']:.1f} ({r['driver_cpu_s']:.1f}, {r['tasks_cpu_s']:.1f}) | "
              f"{r['peak_rss_mb']:.0f} | {lat} | {r['results']:,} |")


def _n(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


if __name__ == "__main__":
    main()
