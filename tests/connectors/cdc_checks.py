"""What the CDC source tests share: a writer thread that inserts, updates
and deletes rows of a table ``(id, v, name)`` (``v`` counts a row's
updates) and what stops it, the check that change events carry every
version of every row exactly once and equal the table, and the runtime in
small (readers restored, polled, checkpointed) at a chosen parallelism."""

from __future__ import annotations

import contextlib
import random
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lockgate.connectors import CollectSink
from lockgate.connectors.base import Source, TaskInfo
from tests.fault.checks import RandomKiller, task_processes


class Writer(threading.Thread):
    """Inserts new ids, updates (``v = v + 1``) and deletes random rows in
    small transactions until stopped (``rate`` transactions a second at the
    most, if given); then runs ``finish`` (the stop marker).

    Subclasses give ``connect()`` (a context manager yielding a connection),
    ``transaction(conn)`` (a context manager), ``execute(conn, sql, params)``
    and ``finish(conn)``."""

    def __init__(self, table: str, next_id: int, seed: int, rate: float | None = None) -> None:
        super().__init__(daemon=True)
        self.table, self.next_id = table, next_id
        self.rng = random.Random(seed)
        self.pause = 0.0 if rate is None else 1 / rate
        self.stop = threading.Event()
        self.ops = 0
        self.error: BaseException | None = None

    def connect(self) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    def transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    def execute(self, conn: Any, sql: str, params: tuple = ()) -> None:
        raise NotImplementedError

    def finish(self, conn: Any) -> None:
        raise NotImplementedError

    def step(self, conn: Any) -> None:
        t, rng = self.table, self.rng
        with self.transaction(conn):
            for _ in range(rng.randint(1, 4)):
                r = rng.random()
                pick = rng.randint(1, self.next_id)
                if r < 0.3:
                    self.execute(conn, f"INSERT INTO {t} VALUES (%s, 0, %s)",
                                 (self.next_id, f"new {self.next_id}"))
                    self.next_id += 1
                elif r < 0.85:
                    self.execute(conn, f"UPDATE {t} SET v = v + 1, name = %s WHERE id = %s",
                                 (f"upd {rng.random():.6f}", pick))
                else:
                    self.execute(conn, f"DELETE FROM {t} WHERE id = %s", (pick,))
        self.ops += 1

    @contextlib.contextmanager
    def running(self) -> Iterator[Writer]:
        """Started for the block; stopped and joined when it is left, and
        then (the block having succeeded) checked to have failed in nothing."""
        self.start()
        try:
            yield self
        finally:
            self.stop.set()
            self.join(60)
        assert self.error is None, self.error

    def run(self) -> None:
        try:
            with self.connect() as conn:
                while not self.stop.wait(self.pause):
                    self.step(conn)
                self.finish(conn)
        except BaseException as e:
            self.error = e


class Stopper(threading.Thread):
    """Stops ``writer`` (the job reads its changes until its stop message)
    once the driven job is where the test needs it (a :class:`Watcher` of
    ``drive``): at least ``after`` seconds of writes, every kill of ``drive``'s
    random killer landed and the attempt after the last one running, attempt
    ``attempt`` running (the named faults' restarts done), and, with ``out``
    (a ``CollectSink`` folder), ``changes`` events of the stream committed.
    The writer so runs past the snapshot and across every kill, whatever the
    restarts cost. After ``limit`` seconds it is stopped anyway, and
    :meth:`check` fails naming what the stopper still waited for."""

    def __init__(self, writer: Writer, *, after: float, attempt: int = 0,
                 out: Path | None = None, changes: int = 0, limit: float = 240.0) -> None:
        super().__init__(daemon=True)
        self.writer, self.after, self.attempt, self.out, self.changes, self.limit = (
            writer, after, attempt, out, changes, limit)
        self.driver: subprocess.Popen | None = None
        self.killer: RandomKiller | None = None
        self.failure: str | None = None
        self.stopped_at: tuple[int, int] | None = None
        """The kills landed and the newest attempt running when it stopped the
        writer, everything it waited for there."""

    def watch(self, driver: subprocess.Popen, killer: RandomKiller) -> None:
        self.driver, self.killer = driver, killer
        self.start()

    def waiting_for(self, elapsed: float) -> str | None:
        """What the writer still has to wait for, or None."""
        assert self.driver is not None and self.killer is not None
        killer = self.killer
        if elapsed < self.after:
            return f"{self.after:.0f} s of writes"
        if not killer.landed():
            return (f"the random killer's kills ({killer.kills} of {killer.kills_planned} "
                    "landed; it strikes a running attempt once all its tasks run)")
        need = max(self.attempt, killer.last_attempt + 1 if killer.kills_planned else 0)
        newest = max((a for a, _ in task_processes(self.driver.pid).values()), default=-1)
        if newest < need:
            return f"attempt {need} to run (the newest running is {newest})"
        if self.out is not None and self.changes:
            got = sum(1 for e in CollectSink(str(self.out)).results() if e[0] != "read")
            if got < self.changes:
                return f"{self.changes} committed changes of the stream ({got} so far)"
        self.stopped_at = (killer.kills, newest)
        return None

    def run(self) -> None:
        assert self.driver is not None
        start = time.monotonic()
        try:
            while not self.writer.stop.is_set():
                elapsed = time.monotonic() - start
                waiting = self.waiting_for(elapsed)
                if waiting is None:
                    return
                if self.driver.poll() is not None:
                    self.failure = f"the job ended while the writer waited for {waiting}"
                    return
                if elapsed > self.limit:
                    self.failure = (f"the writer was stopped after {self.limit:.0f} s, "
                                    f"still waiting for {waiting}")
                    return
                self.writer.stop.wait(0.2)
        except BaseException as e:
            self.failure = f"the stopper failed: {e!r}"
        finally:
            self.writer.stop.set()

    def check(self) -> None:
        self.join(30)
        assert not self.is_alive(), "the stopper did not end within 30 s of the job"
        assert self.failure is None, self.failure


def check(events: list[tuple], table_rows: list[tuple]) -> None:
    """Every row's versions came exactly once, and applying the events
    ``(op, id, v, name, ...)`` gives ``table_rows`` ``(id, v, name)`` row for row."""
    versions: dict[int, list[int]] = {}
    state: dict[int, tuple] = {}
    deletes: dict[int, int] = {}
    for op, rid, v, name, *_ in events:
        if op == "delete":
            deletes[rid] = deletes.get(rid, 0) + 1
        else:
            versions.setdefault(rid, []).append(v)
            if v == max(versions[rid]):
                state[rid] = (v, name)
    for rid, vs in versions.items():
        assert sorted(vs) == list(range(min(vs), max(vs) + 1)), \
            f"id {rid}: versions {sorted(vs)} (a change applied twice or lost)"
    assert all(n == 1 for n in deletes.values()), {k: n for k, n in deletes.items() if n != 1}
    for rid in deletes:
        state.pop(rid, None)
    expected = {rid: (v, name) for rid, v, name in table_rows}
    assert state == expected, (
        f"{len(set(state) ^ set(expected))} ids differ, "
        f"{sum(1 for k in state if k in expected and state[k] != expected[k])} rows differ")


def info(task: int, p: int, attempt: int = 0) -> TaskInfo:
    return TaskInfo("job", "cdc", task, p, 128, attempt)


def read(source: Source, state: list | None, p: int = 1, rounds: int | None = None,
         attempt: int = 0, final_checkpoint: bool = True, to_stream: bool = False,
         batch: int = 100) -> tuple[list[tuple], list, bool]:
    """The runtime in small: ``p`` readers restored from ``state`` (the union
    of every task's entries), polled in turn for at most ``rounds`` rounds
    (``to_stream``: first until the stream started), with a checkpoint
    (every task's snapshot, then the completion notices) every third round,
    and after the last one if ``final_checkpoint`` (else what came after the
    last checkpoint is lost, as in a failure); each poll asks for ``batch``
    records. Returns the committed events
    ``(op, id, v, name, task)``, the state of the last checkpoint and whether
    every task ended."""
    readers = [source.create_reader(info(i, p, attempt)) for i in range(p)]
    for reader in readers:
        reader.restore(None if state is None else list(state))
    committed: list[tuple] = []
    pending: list[tuple] = []
    ended = [False] * p
    checkpoint = 0

    def take_checkpoint() -> None:
        nonlocal state, pending, checkpoint
        checkpoint += 1
        state = [e for reader in readers for e in reader.snapshot_state(checkpoint)]
        committed.extend(pending)
        pending = []
        for reader in readers:
            reader.notify_checkpoint_complete(checkpoint)

    n = 0
    deadline = time.monotonic() + 120
    try:
        while not all(ended) and (rounds is None or n < rounds):
            if to_stream and readers[0].stream["hw"] is None:
                assert time.monotonic() < deadline, "the stream did not start"
                time.sleep(0.01)
            else:
                n += 1
            for i, reader in enumerate(readers):
                if not ended[i]:
                    got = reader.poll(batch)
                    if got is None:
                        ended[i] = True
                        continue
                    pending += [(e.op, (e.row or {}).get("id"), (e.row or {}).get("v"),
                                 (e.row or {}).get("name"), i) for e in got]
            if n % 3 == 0:
                take_checkpoint()
        if final_checkpoint or all(ended):
            take_checkpoint()
    finally:
        for reader in readers:
            reader.close()
    return committed, list(state or []), all(ended)


def rescale_job(name: str, source: Source, p: int, tmp: Path, rate: float = 1500) -> Any:
    """The CDC job of the rescale tests at parallelism ``p``: ``source``
    throttled to ``rate`` records a second, each event as ``as_tuple`` with
    ``p`` appended, collected in ``tmp / "out"``."""
    from lockgate import CheckpointConfig, Pipeline
    from tests.connectors.cdc_job import as_tuple, throttle

    pipeline = Pipeline(name, parallelism=p,
                        checkpoint=CheckpointConfig(interval=0.3, storage=str(tmp / "chk")))
    (pipeline.source(source, uid="cdc")
       .map_batch(throttle(rate), uid="throttle")
       .map(lambda e, p=p: (*as_tuple(e), p), uid="tuples")
       .sink(CollectSink(str(tmp / "out")), uid="out"))
    return pipeline


def await_stream(out: Path, p: int, changes: int = 100, timeout: float = 240) -> None:
    """Wait until the job at parallelism ``p`` of ``rescale_job`` has
    committed ``changes`` events of the stream."""
    deadline = time.monotonic() + timeout
    while sum(1 for e in CollectSink(str(out)).results()
              if e[0] != "read" and e[5] == p) < changes:
        assert time.monotonic() < deadline, "the second hop did not reach the stream"
        time.sleep(0.5)


def stream_entry(state: list) -> dict:
    [stream] = [e for e in state if e.get("role") == "stream"]
    return stream
