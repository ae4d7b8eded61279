"""What the peer systems' W3 scripts (``quix_w3.py``, ``bytewax_w3.py``)
share: their command line, the end offsets of the input, the worker
processes (started with ``spawn``, timed from the first start to the last
exit, their CPU seconds taken from ``RUSAGE_CHILDREN``) and the JSON line
they print. Only the standard library and confluent-kafka: it runs in the
peers' own interpreter (``benchmarks/kafka/requirements-peers.txt``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import time
from collections.abc import Callable, Sequence
from importlib.metadata import version
from typing import Any

from confluent_kafka import Consumer, TopicPartition


def parse(doc: str | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--bootstrap", required=True, help="host:port of the broker")
    ap.add_argument("--input", required=True, help="the topic of W3's integers")
    ap.add_argument("--output", required=True, help="a fresh topic for the running sums")
    ap.add_argument("--n", type=int, required=True, help="records in the input topic")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--interval", type=float, default=1.0,
                    help="commit (epoch) interval in seconds")
    return ap.parse_args()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Per partition of ``topic``, its last stable offset now."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "w3-peer-probe",
                      "isolation.level": "read_committed"})
    try:
        meta = probe.list_topics(topic, timeout=30).topics[topic]
        if meta.error is not None:
            raise RuntimeError(f"topic {topic}: {meta.error}")
        return {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in meta.partitions}
    finally:
        probe.close()


def run_workers(target: Callable[..., None],
                args: Sequence[tuple[Any, ...]]) -> tuple[float, float]:
    """Start one ``spawn`` process per argument tuple, wait for all of them;
    return the wall seconds from the first start to the last exit and the
    CPU seconds (user + system) of the processes. A process that fails ends
    the others and raises."""
    context = multiprocessing.get_context("spawn")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    workers = [context.Process(target=target, args=a) for a in args]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    failed = None
    while any(w.exitcode is None for w in workers) and failed is None:
        for w in workers:
            w.join(0.05)
            if w.exitcode not in (None, 0):
                failed = w
                break
    wall = time.perf_counter() - t0
    if failed is not None:
        for w in workers:
            if w.exitcode is None:
                w.terminate()
            w.join()
        raise RuntimeError(f"a worker process exited with {failed.exitcode}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def report(system: str, package: str, guarantee: str, end: str, args: argparse.Namespace,
           wall: float, cpu: float) -> None:
    """Print the run's one JSON line."""
    print(json.dumps({"system": system, "version": version(package), "guarantee": guarantee,
                      "end": end, "records": args.n, "processes": args.processes,
                      "interval_s": args.interval, "wall_s": round(wall, 3),
                      "records_per_s": round(args.n / wall),
                      "cpu_s": round(cpu, 3),
                      "cpu_s_per_million": round(cpu * 1e6 / args.n, 3)}), flush=True)
