"""Fault injection as data: a test names protocol points where a task kills
itself with SIGKILL (a real, unannounced death, as from the OOM killer).

A fault is a dict ``{"point": str, "task": int | None, "attempt": int | None,
"count": int, "signal": str}``: the task with global number ``task`` (any if None), in job
attempt ``attempt`` (any if None), dies the ``count``-th time it reaches
``point``. ``"signal": "SIGSTOP"`` freezes it there instead (a zombie-to-be:
a task the driver can no longer reach, resumed later by a test);
``"signal": "hang"`` blocks the thread that reached the point for good while
the process runs on (as a read from a storage that never answers). Points:

- ``register``: connected to the coordinator, before it registers (a task
  that never registers: the attempt cannot start)
- ``restore``: registered, about to restore its operators' state

- ``batch``: in the middle of a batch (after the chain ran, before its output is sent)
- ``alignment``: a channel was blocked while other barriers are still awaited
- ``snapshot``: the snapshot is taken, the barrier sent and the state files
  written; the ack is not yet sent
- ``acked``: the ack was sent; the completion notice has not arrived
- ``commit``: the completion notice arrived; sinks have not committed yet
- ``end_of_data``: the task reached the end of its input (final checkpoint ahead)
- ``final_snapshot``: as ``snapshot``, for a snapshot taken after the task
  reached the end of its input (the final checkpoint's): not yet acknowledged
- ``finish``: the final checkpoint completed and the task was told to end
  (its sinks committed); it has not ended yet. The next attempt restores that
  final checkpoint.
- ``unaligned_barrier``: an unaligned checkpoint's snapshot is taken and its
  barrier sent ahead of the output's unsent records; its in-flight input is
  still being recorded
- ``channel_state``: the snapshot writer is halfway through an unaligned
  checkpoint's channel state file (in-flight data), not yet acknowledged
- ``replay``: after a restore, before a recovered in-flight element is sent
  (output channel state) or processed (input channel state)
- ``materialize``: a RocksDB backend with a changelog took a materialization
  between records (a RocksDB checkpoint; its log emptied), which the next
  checkpoint is to upload
- ``changelog``: the snapshot writer uploaded a changelog file (and the
  materialization before it, if any); the checkpoint is not acknowledged
- ``restore_ranges``: a RocksDB task restoring other key groups than one
  incremental handle holds (a rescale) materialized the base handle and
  deleted the key groups it does not own; the other handles' key groups are
  not copied in yet
- ``table_commit``: a lakehouse sink's committer (Delta, Iceberg) has its
  commit ready (append: the files moved into the table; merge: the changes
  read), the table commit is not made
- ``table_committed``: the table commit is made; the committer has not
  noted it

``snapshot`` and ``final_snapshot`` are reached on the task's snapshot writer
thread, before the ack is sent: the kill never races the acknowledgement.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

POINTS = ("register", "restore", "batch", "alignment", "snapshot", "acked", "commit",
          "end_of_data", "final_snapshot", "finish", "unaligned_barrier", "channel_state",
          "replay", "materialize", "changelog", "restore_ranges", "table_commit",
          "table_committed")


class FaultInjector:
    def __init__(self, faults: list[dict[str, Any]], task: int, attempt: int) -> None:
        self._faults = [
            f for f in faults
            if f.get("task") in (None, task) and f.get("attempt") in (None, attempt)
        ]
        for f in self._faults:
            if f["point"] not in POINTS:
                raise ValueError(f"unknown fault point {f['point']!r}; known: {POINTS}")
        self._signals = {id(f): _signal(f.get("signal", "SIGKILL")) for f in self._faults}
        self._hits: Counter[str] = Counter()
        self.active = bool(self._faults)

    def hit(self, point: str) -> None:
        if not self.active:
            return
        self._hits[point] += 1
        for f in self._faults:
            if f["point"] == point and self._hits[point] == f.get("count", 1):
                sig = self._signals[id(f)]
                if sig is None:
                    while True:  # hang
                        time.sleep(3600)
                os.kill(os.getpid(), sig)


def _signal(name: str) -> signal.Signals | None:
    """The signal a fault sends (None: ``"hang"``)."""
    if name == "hang":
        return None
    try:
        return signal.Signals[name]
    except KeyError:
        raise ValueError(f"unknown fault signal {name!r}; use a signal name such as "
                         "'SIGKILL' or 'SIGSTOP', or 'hang'") from None
