"""Helpers of the port tests: a job whose data ports stay open for a few
seconds, finding a process's listening ports, and hostile peers.

A task's data port takes connections only until every upstream task of the
attempt connected (then it closes), so the job's source sleeps in
``create_reader`` (:class:`SlowStartSequence`): its downstream tasks already
wait for it on their data ports, which the test then floods."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, SequenceSource
from lockgate.connectors.base import TaskInfo
from lockgate.connectors.sequence import SequenceReader
from tests.fault.checks import task_processes

NONCE_BYTES = 32


class SlowStartSequence(SequenceSource):
    """A :class:`SequenceSource` whose readers start ``delay`` seconds late."""

    def __init__(self, start: int, end: int, delay: float) -> None:
        super().__init__(start, end)
        self.delay = delay

    def create_reader(self, info: TaskInfo) -> SequenceReader:
        time.sleep(self.delay)
        return super().create_reader(info)


def sums_job(tmp: Path, *, n: int, keys: int, delay: float,
             encrypt: bool = False) -> Pipeline:
    """numbers 1..n (starting ``delay`` s late) -> (x % keys, x) -> running
    sums per key -> JSONL file sink, parallelism 2: two source tasks, two tasks with
    a data port."""
    p = Pipeline("ports", parallelism=2, checkpoint=CheckpointConfig(
        interval=0.3, storage=str(tmp / "chk"), encrypt_traffic=encrypt))
    (p.source(SlowStartSequence(1, n, delay), uid="numbers")
       .map(lambda x: (x % keys, x), uid="pairs")
       .key_by(lambda kv: kv[0])
       .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
       .sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out"))
    return p


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its sockets' inodes matched
    in ``/proc/<pid>/net/tcp``)."""
    inodes = set()
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports = set()
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        with open(f"/proc/{pid}/net/tcp") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


def data_ports(driver_pid: int, want: int, timeout: float = 60.0) -> dict[int, int]:
    """``{task: data port}`` of the first attempt's tasks once ``want`` of them
    listen (polled every 10 ms for ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for pid, (_attempt, task) in task_processes(driver_pid).items():
            ports = listening_ports(pid)
            if ports:
                found[task] = min(ports)
        if len(found) >= want:
            return found
        time.sleep(0.01)
    raise AssertionError(f"fewer than {want} task data ports within {timeout} s")


def garbage(port: int, rng: random.Random) -> bool:
    """Connect, send random bytes (a short or a long burst), close. True if
    the listener had sent its challenge (it was taking connections)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.settimeout(5)
        s.sendall(rng.randbytes(rng.choice([7, 40, 64, 200, 5000])))
        try:
            challenged = len(s.recv(NONCE_BYTES)) > 0
        except OSError:
            challenged = False
    return challenged


@contextlib.contextmanager
def silent(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections that never send a byte, closed at the end."""
    socks = []
    try:
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.settimeout(15)
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """The listener closed ``sock`` (after its challenge) within ``within`` s."""
    sock.settimeout(within)
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            if not sock.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except OSError:
        return False
    return False
