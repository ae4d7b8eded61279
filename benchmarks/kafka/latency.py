"""End-to-end latency of exactly-once Kafka output (workload W3).

    python -m benchmarks.kafka.latency [--intervals 1.0 0.2 0.1] [--rounds 2]
        [--n 1000000] [--rate R] [--seconds 20] [--warmup 5]
        [--launchers local] [--bootstrap host:port] [--inline-threshold B]
        [--buffer-timeout S] [--split] [--history DIR] [--record]

Two phases, each on a private noida-db broker of its own (or all on
``--bootstrap``):

1. **Throughput.** A bounded W3 run (``--n`` integers in topic ``in``, 4
   partitions, key ``x % 1000``, a running sum per key, one record per input
   to ``out``, exactly-once, 2 workers) at each checkpoint interval, the
   intervals interleaved round by round; records/s is ``n`` / wall time
   (start-up included, as ``python -m benchmarks.kafka``), median of rounds.
2. **Latency.** The same job with an unbounded source, fed at a fixed rate
   (``--rate``, by default half the live maximum, below) by a producer
   process that stamps each record's Kafka timestamp with its produce time;
   the job carries the timestamp of the input that made each sum into its
   output record; a watcher process notes when each output record becomes
   visible to a ``read_committed`` consumer (its partition's last stable
   offset passed it; read every 20 ms). Latency = visible -
   produced, for records produced after ``--warmup`` seconds, over
   ``--seconds`` seconds; p50, p99 and max per interval (median over
   rounds), with the job's checkpoint history (duration, alignment, the
   synchronous and asynchronous parts) summarized. Each latency round
   (those of the live maximum's search too) starts a fresh broker: noida-db
   keeps what earlier rounds did (its resident memory grows to about a
   gigabyte over the throughput phase, deleted topics and all), and on it
   records and commits stall for hundreds of milliseconds at a time that a
   fresh broker does not show, which would measure the broker's history,
   not the job.

The live maximum is the highest rate the job keeps up with while the
producer, the watcher and the broker share its machine (on a 2-core
machine they take a good part of it, so it is below the throughput of
phase 1, read from a topic filled beforehand): offered the throughput at
the longest interval (or ``--max-from``), the job makes visible what it
can; that rate is offered next, until at least 98% of what is offered
becomes visible on time; then the gap to the lowest rate it did not keep
up with is halved, up to three times while it is over a tenth.

``--sink-config JSON``: librdkafka settings of the latency job's sink
producer (``KafkaSink(config=...)``, e.g. ``'{"linger.ms": 5}'``).
``--inline-threshold``: the latency job's ``CheckpointConfig.inline_threshold``
(state files of at most that many bytes kept in ``_metadata``; default:
the configuration's default). ``--buffer-timeout``: the latency job's
``Pipeline(buffer_timeout=...)`` (default: the pipeline's default).

``--split``: the sink also stamps each output record with the time it
writes it, and each round reports where the latency of its slowest 1% of
records went (``slow_*_ms``, means): reaching the sink, waiting for the
trigger of the checkpoint that covers it (a checkpoint in progress finishes
first: one runs at a time), that checkpoint (trigger to completion), and
completion to visibility (the notification, the commit, the consumer's
poll); and ``to_sink_p99_ms``.

``--record`` appends one line per interval to
``benchmarks/results/kafka_latency.jsonl`` (date, commit, load average).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.kafka import BROKER_DIR  # noqa: E402
from benchmarks.record import record  # noqa: E402
from tests.connectors.kafka_server import noida_broker  # noqa: E402
from tests.connectors.kafka_sums_job import build  # noqa: E402
from tests.connectors.kafka_topics import delete_topic, new_topic, produce_numbers  # noqa: E402

PARTITIONS = 4
BISECTIONS = 3
"""Steps of the live maximum's search between the highest rate kept up
with and the lowest one not (:func:`live_maximum`)."""
KEEPS_UP = 0.98
"""The share of the offered rate made visible over a round that counts as
keeping up (measured at the shortest interval: a 15 s round of 1 s
checkpoints counts what became visible only to a fifteenth)."""
WATCH_EVERY = 0.02
"""Seconds between two reads of the output's last stable offsets: a
record's visibility is noted up to that late. Every 5 ms, the watcher's
ListOffsets requests (read_committed) took a good part of noida-db's main
thread, and the job's input reached its consumers hundreds of milliseconds
late: its records reached the sink at p99 in 160–920 ms (median of 12
runs about 450 ms) at 85,000 records/s, against 100–240 ms every 20 or
50 ms."""


# ------------------------------------------------------------------ the job
def stamped(keys: int) -> Any:
    def pair(r: Any) -> tuple[int, int, int]:
        x = int(r.value)
        return (x % keys, x, r.timestamp)
    return pair


def add(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
    return (a[0], a[1] + b[1], b[2])


def serialize(kst: tuple[int, int, int]) -> tuple[str, str]:
    return str(kst[0]), f"{kst[0]},{kst[1]},{kst[2]}"


def serialize_split(kst: tuple[int, int, int]) -> tuple[str, str]:
    """As :func:`serialize`, with the time the sink writes it (ms) last."""
    return str(kst[0]), f"{kst[0]},{kst[1]},{kst[2]},{int(time.time() * 1000)}"


def latency_job(bootstrap: str, source: str, out: str, *, parallelism: int, keys: int,
                storage: str, interval: float, inline_threshold: int | None = None,
                split: bool = False, buffer_timeout: float | None = None,
                sink_config: dict[str, Any] | None = None) -> Any:
    from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
    from lockgate.connectors.kafka import KafkaSink, KafkaSource

    inline = {} if inline_threshold is None else {"inline_threshold": inline_threshold}
    timeout = {} if buffer_timeout is None else {"buffer_timeout": buffer_timeout}
    p = Pipeline("kafka-latency", parallelism=parallelism, **timeout,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage, timeout=30.0,
                                             **inline),
                 restart=FixedDelayRestart(max_attempts=3, delay_s=0.0))
    (p.source(KafkaSource(bootstrap, source), uid="numbers")
       .map(stamped(keys), uid="pairs")
       .key_by(lambda kst: kst[0])
       .reduce(add, uid="sums")
       .sink(KafkaSink(bootstrap, out, serializer=serialize_split if split else serialize,
                       config=sink_config), uid="out"))
    return p


# ------------------------------------------------------- producer, consumer
def produce_at_rate(bootstrap: str, topic: str, rate: float, seconds: float,
                    ready: Any) -> None:
    """``rate`` records/s for ``seconds``: every 2 ms (or as soon as it gets
    a CPU) the records due since the last pass, each stamped with the time
    of that pass: the time it is sent, not the time it was due."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "queue.buffering.max.messages": 1_000_000})
    ready.wait()
    produce, poll = producer.produce, producer.poll
    start = time.time()
    x = 0
    while True:
        now = time.time()
        if now - start >= seconds:
            break
        due = int((now - start) * rate)
        ms = int(now * 1000)
        while x < due:
            try:
                produce(topic, str(x + 1).encode(), partition=(x + 1) % PARTITIONS,
                        timestamp=ms)
            except BufferError:  # the broker is behind: wait for deliveries
                poll(0.01)
                break
            x += 1
        poll(0)
        time.sleep(0.002)
    producer.flush(30)


def watch(bootstrap: str, topic: str, since_ms: Any, stop: Any, out: Any,
          split: bool = False, every: float = WATCH_EVERY) -> None:
    """Latencies (ms) of ``topic``'s records produced after ``since_ms``, as
    a read_committed consumer sees them, until ``stop`` is set; ``split``:
    also ``(produced, written by the sink, visible)`` of each.

    A record is visible to a ``read_committed`` consumer once its partition's
    last stable offset (LSO) is past it. The watcher asks the broker for the
    LSO of every partition (one ListOffsets request) every ``every`` seconds
    and notes when each advanced; once ``stop`` is set it reads the records
    and gives each the time its offset became visible. A record's latency is
    thus late by up to ``every`` (plus the request's round trip), never
    early (it runs at the job's priority: at a lower one, the time it
    waited for a CPU would count as latency). A consumer fetching all along
    would tell the same, but against a broker that answers every fetch at
    once (noida-db does not hold a fetch for ``fetch.wait.max.ms``) it
    fetches in a loop between two commits and takes a core from the job it
    measures."""
    from confluent_kafka import Consumer, IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    spec = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(PARTITIONS)}
    # per partition: the LSOs seen, and when (ms), in order
    lsos: list[list[int]] = [[0] for _ in range(PARTITIONS)]
    times: list[list[int]] = [[0] for _ in range(PARTITIONS)]
    while not stop.is_set():
        futures = admin.list_offsets(spec, isolation_level=IsolationLevel.READ_COMMITTED,
                                     request_timeout=10)
        answers = {tp.partition: f.result().offset for tp, f in futures.items()}
        now = int(time.time() * 1000)
        for p, lso in answers.items():
            if lso > lsos[p][-1]:
                lsos[p].append(lso)
                times[p].append(now)
        time.sleep(every)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "latency-watch",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         # noida-db answers a fetch with all it has, whatever fetch.max.bytes
                         "receive.message.max.bytes": 1 << 30})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    ends = [lsos[p][-1] for p in range(PARTITIONS)]
    lat: list[int] = []
    rows: list[tuple[int, int, int]] = []
    seen = 0
    since = since_ms.value
    # every record is visible once stopped: read until none came for 2 s (the
    # first fetch can take longer on a loaded machine: up to a minute)
    deadline = time.monotonic() + 60
    while True:
        msgs = consumer.consume(20_000, 2.0)
        if not msgs:
            if seen or time.monotonic() > deadline:
                break
            continue
        for m in msgs:
            if m.error() is not None:
                continue
            p, offset = m.partition(), m.offset()
            if offset >= ends[p]:
                continue
            seen += 1
            # the first LSO past the offset: when the record became visible
            visible = times[p][bisect.bisect_right(lsos[p], offset)]
            fields = m.value().split(b",")
            t = int(fields[2])
            if t >= since:
                lat.append(visible - t)
                if split:
                    rows.append((t, int(fields[3]), visible))
    consumer.close()
    out.put((seen, lat, rows, [list(zip(times[p], lsos[p], strict=True))
                               for p in range(PARTITIONS)]))


# ------------------------------------------------------------------- phases
def throughput_round(bootstrap: str, source: str, n: int, interval: float, args: Any) -> float:
    out = new_topic(bootstrap, "lat-w3", PARTITIONS)
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-lat-"))
    try:
        p = build(bootstrap, source, out, parallelism=args.parallelism, keys=args.keys,
                  storage=str(tmp / "chk"), interval=interval)
        t0 = time.perf_counter()
        result = p.run(launcher=args.launcher, progress=False)
        wall = time.perf_counter() - t0
        assert result.status == "finished", result
        return n / wall
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        delete_topic(bootstrap, out)  # the broker keeps them in memory


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def checkpoint_costs(history: list[dict[str, Any]], since: float,
                     until: float) -> dict[str, Any]:
    done = [h for h in history if h["status"] == "completed" and h["kind"] == "checkpoint"
            and since <= h["trigger_time"] <= until]
    def med(key: str) -> float | None:
        xs = [h[key] for h in done if h.get(key) is not None]  # older: no metadata_duration
        return round(statistics.median(xs) * 1000, 1) if xs else None
    span = (max(h["trigger_time"] for h in done) - min(h["trigger_time"] for h in done)
            if len(done) > 1 else 0.0)
    return {"checkpoints": len(done),
            "per_s": round((len(done) - 1) / span, 2) if span else None,
            "duration_ms": med("duration"), "alignment_ms": med("alignment"),
            "sync_ms": med("sync_duration"), "async_ms": med("async_duration"),
            "metadata_ms": med("metadata_duration"),
            "size_bytes": int(statistics.median([h["size"] for h in done])) if done else None}


def split_latency(rows: list[tuple[int, int, int]],
                  history: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the latency of the slowest 1% of ``rows`` (produced, written by
    the sink, visible; ms) went, as means: to the sink, waiting for the
    trigger of the checkpoint that covers the record (the first triggered
    after the write, or the one before if that completed first, its barrier
    having reached the sink after the write), that checkpoint from trigger
    to completion, and completion to visibility."""
    done = sorted((h for h in history if h["status"] == "completed" and h.get("completed_time")),
                  key=lambda h: h["trigger_time"])
    triggers = [h["trigger_time"] * 1000 for h in done]
    completions = [h["completed_time"] * 1000 for h in done]
    parts: list[tuple[float, float, float, float, float]] = []
    for t, s, v in rows:
        i = bisect.bisect_left(triggers, s)
        if i > 0 and completions[i - 1] <= v and (i == len(done) or v < completions[i]):
            i -= 1
        if i < len(done):
            parts.append((v - t, s - t, max(0.0, triggers[i] - s),
                          completions[i] - max(triggers[i], s), v - completions[i]))
    if not parts:
        return {}
    parts.sort()
    slow = parts[-max(1, len(parts) // 100):]
    names = ("slow_to_sink_ms", "slow_wait_ms", "slow_checkpoint_ms", "slow_to_visible_ms")
    return {"to_sink_p99_ms": pct([p[1] for p in parts], 0.99),
            **{name: round(statistics.mean(p[j + 1] for p in slow), 1)
               for j, name in enumerate(names)}}


@contextlib.contextmanager
def broker(args: Any) -> Iterator[str]:
    """``--bootstrap``, or a fresh broker of this benchmark's own (stopped
    after)."""
    if args.bootstrap:
        yield args.bootstrap
    else:
        with noida_broker(args.broker_dir) as bootstrap:
            yield bootstrap


def latency_round(interval: float, rate: float, args: Any) -> dict[str, Any]:
    with broker(args) as bootstrap:
        return _latency_round(bootstrap, interval, rate, args)


def _latency_round(bootstrap: str, interval: float, rate: float,
                   args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    source = new_topic(bootstrap, "lat-in", PARTITIONS)
    out = new_topic(bootstrap, "lat-out", PARTITIONS)
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-lat-"))
    p = latency_job(bootstrap, source, out, parallelism=args.parallelism, keys=args.keys,
                    storage=str(tmp / "chk"), interval=interval,
                    inline_threshold=args.inline_threshold, split=args.split,
                    buffer_timeout=args.buffer_timeout, sink_config=args.sink_config)
    job = p.start(launcher=args.launcher, progress=False)
    try:
        ready = ctx.Event()
        since = ctx.Value("q", 1 << 62)
        results = ctx.Queue()
        total = args.warmup + args.seconds
        producer = ctx.Process(target=produce_at_rate,
                               args=(bootstrap, source, rate, total, ready))
        stop = ctx.Event()
        watcher = ctx.Process(target=watch,
                              args=(bootstrap, out, since, stop, results, args.split))
        producer.start()
        watcher.start()
        _wait_running(job)
        t0 = time.time()
        ready.set()
        since.value = int((t0 + args.warmup) * 1000)
        producer.join(total + 60)
        t1 = time.time()
        # the last records need a checkpoint or two to become visible
        time.sleep(max(3.0, 3 * interval))
        history = job.checkpoints()
        stop.set()
        seen, lat, rows, visible = results.get(timeout=120)
        watcher.join(10)
        costs = checkpoint_costs(history, t0 + args.warmup, t1)
        if args.history:
            Path(args.history).mkdir(parents=True, exist_ok=True)
            name = f"{args.launcher}-{interval}s-{int(t0)}.json"
            (Path(args.history) / name).write_text(json.dumps(
                {"since": t0 + args.warmup, "until": t1, "checkpoints": history}))
    finally:
        job.cancel()
        shutil.rmtree(tmp, ignore_errors=True)
        for topic in (source, out):  # the broker keeps them in memory
            delete_topic(bootstrap, topic)
    expected = int(total * rate)
    return {"interval_s": interval, "rate": rate, "produced": expected, "seen": seen,
            "out_rate": out_rate(visible, t0 + args.warmup, t1),
            "measured": len(lat), "p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99),
            "max_ms": max(lat) if lat else None, **costs, **split_latency(rows, history)}


def out_rate(visible: list[list[tuple[int, int]]], since: float, until: float) -> float:
    """Records/s that became visible between ``since`` and ``until`` (s),
    from each partition's ``(time ms, last stable offset)`` steps (offsets
    count the transactions' commit markers too: a few per second)."""
    def at(steps: list[tuple[int, int]], t: float) -> int:
        i = bisect.bisect_right([ms for ms, _ in steps], t * 1000)
        return steps[i - 1][1] if i else 0
    return sum(at(s, until) - at(s, since) for s in visible) / (until - since)


def live_maximum(start: float, interval: float, args: Any) -> float:
    """The highest rate the job keeps up with while the producer feeds it on
    the same machine: offered ``start`` records/s, the job makes visible
    what it can; that rate is offered next, until the job keeps up with
    what it is offered (``KEEPS_UP`` of it visible on time); then the gap
    between that rate and the lowest one it did not keep up with is halved,
    up to ``BISECTIONS`` times while it is more than a tenth (overloaded,
    a job makes visible less than it keeps up with when it is not: the
    first steps find a rate below the maximum)."""
    def kept_up(rate: float) -> tuple[bool, float]:
        got = latency_round(interval, rate, args)["out_rate"]
        print(f"live: offered {rate:,.0f} records/s, visible {got:,.0f}/s", flush=True)
        return got >= KEEPS_UP * rate, got
    rate, too_much = start, None
    for _ in range(4):
        ok, got = kept_up(rate)
        if ok:
            break
        rate, too_much = got, rate
    for _ in range(BISECTIONS):
        if too_much is None or too_much <= 1.1 * rate:
            break
        middle = (rate + too_much) / 2
        if kept_up(middle)[0]:
            rate = middle
        else:
            too_much = middle
    return rate


def _wait_running(job: Any) -> None:
    """Wait until every task runs (its first checkpoint completed)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if any(h["status"] == "completed" for h in job.checkpoints()):
            return
        time.sleep(0.05)
    raise TimeoutError("the job took no checkpoint in 120 s")


def _median(xs: list[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 1) if xs else None


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


# -------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--intervals", type=float, nargs="+", default=[1.0, 0.2, 0.1])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--rate", type=float,
                    help="records/s (default: half the live maximum, see the docstring)")
    ap.add_argument("--max-from", type=float,
                    help="records/s the search for the live maximum starts from "
                         "(default: the throughput at the longest interval)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    ap.add_argument("--no-throughput", dest="throughput", action="store_false")
    ap.add_argument("--bootstrap", default=os.environ.get("LOCKGATE_KAFKA"))
    ap.add_argument("--broker-dir", default=BROKER_DIR,
                    help="where the benchmark's own broker keeps its data (default: "
                         f"{BROKER_DIR}, memory, when it exists: see the docstring)")
    ap.add_argument("--inline-threshold", type=int,
                    help="the latency job's CheckpointConfig.inline_threshold (bytes)")
    ap.add_argument("--buffer-timeout", type=float,
                    help="the latency job's Pipeline(buffer_timeout=...) (seconds)")
    ap.add_argument("--sink-config", type=json.loads, metavar="JSON",
                    help="the sink producer's librdkafka settings, e.g. '{\"linger.ms\": 5}'")
    ap.add_argument("--split", action="store_true",
                    help="report where the slowest records' latency went (see the docstring)")
    ap.add_argument("--history", metavar="DIR",
                    help="write each latency round's checkpoint history to DIR as JSON")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    loads = [os.getloadavg()[0]]
    rates: dict[float, list[float]] = {i: [] for i in args.intervals}
    lats: dict[float, list[dict[str, Any]]] = {i: [] for i in args.intervals}
    if args.throughput:
        with broker(args) as bootstrap:
            source = new_topic(bootstrap, "lat-w3-in", PARTITIONS)
            produce_numbers(bootstrap, source, 1, args.n, PARTITIONS)
            for r in range(args.rounds):
                for i in args.intervals:
                    rates[i].append(throughput_round(bootstrap, source, args.n, i, args))
                    loads.append(os.getloadavg()[0])
                    print(f"round {r + 1}: interval {i} s: {rates[i][-1]:,.0f} records/s",
                          flush=True)
    top = max(args.intervals)
    live_max = None
    if args.rate:
        rate = args.rate
    else:
        start = args.max_from or (statistics.median(rates[top]) if rates[top] else None)
        if start is None:
            ap.error("--no-throughput needs --rate or --max-from")
        live_max = live_maximum(start, min(args.intervals), args)
        rate = live_max / 2
    print(f"latency at {rate:,.0f} records/s", flush=True)
    for r in range(args.rounds):
        for i in args.intervals:
            lats[i].append(latency_round(i, rate, args))
            loads.append(os.getloadavg()[0])
            print(f"round {r + 1}: {json.dumps(lats[i][-1])}", flush=True)
    load = round(statistics.median(loads), 2)
    print(f"\nW3 latency, {args.launcher} launcher, p={args.parallelism}, "
          f"{rate:,.0f} records/s"
          + (f" (half the live maximum, {live_max:,.0f})" if live_max else "")
          + f", median of {args.rounds} rounds, load {load}")
    cols = ("p50_ms", "p99_ms", "max_ms", "duration_ms", "alignment_ms", "sync_ms", "async_ms",
            "metadata_ms", "per_s", "size_bytes")
    if args.split:
        cols += ("to_sink_p99_ms", "slow_to_sink_ms", "slow_wait_ms", "slow_checkpoint_ms",
                 "slow_to_visible_ms")
    print(f"{'interval':>9}{'records/s':>11}" + "".join(f"{c[:-3] if c.endswith('_ms') else c:>10}"
                                                    for c in cols))
    for i in args.intervals:
        tp = round(statistics.median(rates[i])) if rates[i] else None
        row = {k: _median([x.get(k) for x in lats[i]]) for k in cols}
        print(f"{i:>9}{tp or 0:>11,}" + "".join(f"{_fmt(row[c]):>10}" for c in cols))
        if args.record:
            line = {"load": load, "workload": "W3",
                    "launcher": args.launcher, "parallelism": args.parallelism,
                    "interval_s": i, "records_per_s": tp, "throughput_records": args.n,
                    "latency_rate": round(rate), "latency_seconds": args.seconds,
                    "live_maximum": round(live_max) if live_max else None,
                    "rounds": args.rounds, "stat": "median",
                    "inline_threshold": args.inline_threshold,
                    "buffer_timeout": args.buffer_timeout, **row}
            record("kafka_latency", [line])


if __name__ == "__main__":
    main()
