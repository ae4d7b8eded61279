"""The state-TTL job: keyed state of every kind with TTL, on a clock that is
the record itself, and its plain-Python reference.

Why the output is deterministic although TTL is processing time: the TTL
clock of the keyed function is *the number it is processing* (injected with
``StateTtlConfig(clock=...)``), not the wall clock. The numbers come from one
source task in ascending order, and each keyed task reads them from that one
channel, so every keyed task's clock only moves forward, through restarts
too: a restored task replays from the checkpoint's position, past every
timestamp its state holds. Then every cleanup path removes only what any
later read would find expired anyway: a read at ``x`` drops what expired at
``x``; the incremental cleanup (on access and for every record) and the
snapshot filter drop what expired at the task's current clock, and every
later read comes at that time or after. So the output is a function of the
numbers alone — exactly what :func:`reference` computes with the TTL rules
(``expired once timestamp + ttl <= now``) — whatever the kills, restores,
rescales and cleanup timing; a cleanup that removed a live value, or a read
that returned an expired one, changes it.

Keys: in block ``b`` of ``BLOCK`` numbers, ``x`` belongs to key ``x % 5 +
5 * (b % 2)``: five keys are active in even blocks, five in odd ones, so a
key's session state expires between its blocks (and its keys, untouched for
a whole block, are what the incremental cleanup and the snapshot filter
remove). Per record ``[x, key, first, since, count, len(recent),
sum(recent), len(digits)]``:

- ``first`` (value, ON_CREATE_AND_WRITE, ``FIRST_TTL``): set when absent, so
  it expires ``FIRST_TTL`` after it was set even while the key is busy;
- ``since`` (value, ON_READ_AND_WRITE, ``SESSION_TTL``): set when absent,
  renewed by every read, so it lives as long as the key's block;
- ``count`` (value with a default, ``SESSION_TTL``): records since then;
- ``recent`` (list, ``RECENT_TTL``): each element expires on its own;
- ``digits`` (map ``x % 7 -> x``, ``DIGITS_TTL``): each entry on its own.

Run as the driver process of a fault test::

    python tests/fault/ttl_job.py --n 20000 --parallelism 2 --out OUT --storage CHK

Prints the JobResult as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from typing import Any

from lockgate import (
    CheckpointConfig,
    FixedDelayRestart,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    Pipeline,
    ValueStateDescriptor,
)
from lockgate.connectors import FileSink, SequenceSource
from lockgate.state.ttl_config import IncrementalCleanup, StateTtlConfig, UpdateType

BLOCK = 1000
FIRST_TTL = 300
SESSION_TTL = 600
RECENT_TTL = 100
DIGITS_TTL = 20
TTLS = {"first": FIRST_TTL, "since": SESSION_TTL, "count": SESSION_TTL,
        "recent": RECENT_TTL, "digits": DIGITS_TTL}


def key_of(x: int) -> int:
    return x % 5 + 5 * ((x // BLOCK) % 2)


class TtlRecords(KeyedProcessFunction):
    """Keyed state of every kind with TTL on the record clock (module
    docstring); with ``incremental``, Flink's incremental cleanup on every
    access and for every record, otherwise only on reads and in snapshots."""

    def __init__(self, incremental: bool = True) -> None:
        self.incremental = incremental

    def open(self, ctx: Any) -> None:
        self.now = 0
        cleanup = IncrementalCleanup(3, run_for_every_record=True) if self.incremental else None

        def ttl(ms: int, **kw: Any) -> StateTtlConfig:
            return StateTtlConfig(ms, clock=self.clock, cleanup_incrementally=cleanup, **kw)

        self.first = ctx.get_state(ValueStateDescriptor("first", ttl=ttl(FIRST_TTL)))
        self.since = ctx.get_state(ValueStateDescriptor(
            "since", ttl=ttl(SESSION_TTL, update_type=UpdateType.ON_READ_AND_WRITE)))
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0,
                                                        ttl=ttl(SESSION_TTL)))
        self.recent = ctx.get_list_state(ListStateDescriptor("recent", ttl=ttl(RECENT_TTL)))
        self.digits = ctx.get_map_state(MapStateDescriptor("digits", ttl=ttl(DIGITS_TTL)))

    def clock(self) -> int:
        return self.now

    def process_element(self, x: int, ctx: Any) -> Any:
        self.now = x
        first = self.first.value()
        if first is None:
            first = x
            self.first.update(x)
        since = self.since.value()
        if since is None:
            since = x
            self.since.update(x)
        count = self.count.value() + 1
        self.count.update(count)
        self.recent.add(x)
        recent = self.recent.get()
        self.digits.put(x % 7, x)
        yield [x, ctx.current_key, first, since, count, len(recent), sum(recent),
               len(self.digits.keys())]


def reference_states(n: int) -> tuple[list[list[int]], dict[int, dict[str, Any]]]:
    """The job's output for ``1..n`` with the TTL rules written out, and each
    key's stored state after ``n`` as ``{state: (value, timestamp)}``
    (``recent``: a list of pairs, ``digits``: a dict of pairs)."""
    states: dict[int, dict[str, Any]] = {}
    out: list[list[int]] = []

    def alive(pair: tuple[Any, int] | None, ttl: int, now: int) -> bool:
        return pair is not None and pair[1] + ttl > now

    for x in range(1, n + 1):
        k = key_of(x)
        s = states.setdefault(k, {"recent": [], "digits": {}})
        if not alive(s.get("first"), FIRST_TTL, x):
            s["first"] = (x, x)
        since = s.get("since")
        s["since"] = (since[0], x) if alive(since, SESSION_TTL, x) else (x, x)
        count = s["count"][0] + 1 if alive(s.get("count"), SESSION_TTL, x) else 1
        s["count"] = (count, x)
        s["recent"] = [p for p in s["recent"] if alive(p, RECENT_TTL, x)] + [(x, x)]
        digits = {d: p for d, p in s["digits"].items() if alive(p, DIGITS_TTL, x)}
        digits[x % 7] = (x, x)
        s["digits"] = digits
        out.append([x, k, s["first"][0], s["since"][0], count, len(s["recent"]),
                    sum(v for v, _ in s["recent"]), len(digits)])
    return out, states


def reference(n: int) -> list[list[int]]:
    return reference_states(n)[0]


def build(n: int, parallelism: int, out: str, storage: str, interval: float = 0.2,
          rate: float | None = None, incremental: bool = True,
          state_backend: str | None = None) -> Pipeline:
    p = Pipeline("ttl", parallelism=parallelism, state_backend=state_backend,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage, timeout=30.0),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))
    (p.source(SequenceSource(1, n, rate=rate), uid="numbers", parallelism=1)
      .key_by(key_of)
      .process(TtlRecords(incremental), uid="ttl")
      .sink(FileSink(out, format="jsonl"), uid="out"))
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--rate", type=float)
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    ap.add_argument("--state-backend", choices=["heap", "rocksdb"],
                    help="default: LOCKGATE_STATE_BACKEND, else heap")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    p = build(args.n, args.parallelism, args.out, args.storage, args.interval, args.rate,
              state_backend=args.state_backend)
    result = p.run(launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
