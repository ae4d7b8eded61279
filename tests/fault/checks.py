"""Driving a job under kills: finding, stopping and killing its task processes.

The checks of a job's committed output, shared with the other test areas, are
in ``tests/fixtures.py``."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

from lockgate.cluster.spark.host import HOST_PROCESS_PREFIX
from lockgate.runtime.spec import TASK_PROCESS_PREFIX

HERE = Path(__file__).parent


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, grandchildren, ...)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except (FileNotFoundError, ProcessLookupError):
            continue
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    children = {int(p) for p in f.read().split()}
            except (FileNotFoundError, ProcessLookupError):
                continue
            todo.extend(children - found)
            found |= children
    return found


def task_processes(driver_pid: int) -> dict[int, tuple[int, int]]:
    """The running Lockgate tasks below the driver, with either launcher, as
    ``{pid: (attempt, task)}``: the processes named ``lgtask-<attempt>-<task>``
    (a local launcher's subprocess, or the Spark Python worker running a task;
    idle Spark workers are left alone)."""
    found: dict[int, tuple[int, int]] = {}
    for pid in descendants(driver_pid):
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if name.startswith(TASK_PROCESS_PREFIX):
            attempt, _, task = name[len(TASK_PROCESS_PREFIX):].partition("-")
            if attempt.isdigit() and task.isdigit():
                found[pid] = (int(attempt), int(task))
    return found


def spark_host_of(pid: int) -> int | None:
    """The Spark host (``lghost-...``, the Python worker) whose child task
    ``pid`` is, or None (a local launcher's task)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{ppid}/comm") as f:
            name = f.read().strip()
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None
    return ppid if name.startswith(HOST_PROCESS_PREFIX) else None


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` in ``/proc/<pid>/stat`` ("R", "S",
    "T" for stopped, "Z" for exited but not yet reaped), or None once it has
    been reaped: another thread may reap it at any moment."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def wait_stopped(pid: int, timeout: float = 30.0) -> None:
    """Return once the process ``pid``, sent SIGSTOP, has stopped. A child of
    this process (a local launcher's task) is awaited with ``waitid``, an
    event; another process (a Spark Python worker, forked by Spark's daemon)
    gives no event to await, so its state in ``/proc/<pid>/stat`` is polled."""
    try:
        os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOWAIT)
        return
    except ChildProcessError:
        pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = process_state(pid)
        if state in ("T", "t"):
            return
        if state is None:
            raise AssertionError(f"process {pid} ended instead of stopping")
        time.sleep(0.005)  # no event to await for a process that is not our child
    raise AssertionError(f"process {pid} did not stop within {timeout} s")


def fork_servers(driver_pid: int) -> set[int]:
    """The local launcher's fork server(s) of the driver: its direct children
    named ``lgforkserver`` (the tasks they fork are their children, not the
    driver's)."""
    found: set[int] = set()
    try:
        tids = os.listdir(f"/proc/{driver_pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return found
    for tid in tids:
        try:
            with open(f"/proc/{driver_pid}/task/{tid}/children") as f:
                children = {int(p) for p in f.read().split()}
        except (FileNotFoundError, ProcessLookupError):
            continue
        for pid in children:
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == "lgforkserver" and process_state(pid) != "Z":
                        found.add(pid)
            except (FileNotFoundError, ProcessLookupError):
                continue
    return found


def task_pids(driver_pid: int) -> set[int]:
    """The pids of :func:`task_processes`."""
    return set(task_processes(driver_pid))


class RandomKiller(threading.Thread):
    """SIGKILLs a random task of the running attempt at random moments, then
    waits for the next attempt's tasks before it strikes again."""

    def __init__(self, driver: subprocess.Popen, kills: int, n_tasks: int, seed: int,
                 min_delay: float = 0.2, max_delay: float = 1.0,
                 hosts: float = 0.0, fork_server: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.fork_server = fork_server
        """The share of kills that strike the local launcher's fork server: half
        of them at a random moment of a running attempt, half while it forks
        the tasks of the attempt after a task's kill."""
        self.fork_server_kills = 0
        self.hosts = hosts
        """The share of kills that strike the victim's Spark host (the Python
        worker whose child the task is) instead of the task itself."""
        self.host_kills = 0
        self.driver = driver
        self.kills_planned = kills
        self.n_tasks = n_tasks
        self.rng = random.Random(seed)
        self.delays = (min_delay, max_delay)
        self.kills = 0
        self.last_attempt = -1
        """The attempt the last kill struck (set before ``kills`` counts it)."""
        self.stop = threading.Event()

    def landed(self) -> bool:
        """Every planned kill struck."""
        return self.kills >= self.kills_planned

    def run(self) -> None:
        while self.kills < self.kills_planned and not self.stop.is_set():
            # Wait for every task of an attempt after the last victim's.
            tasks = task_processes(self.driver.pid)
            newest = max((a for a, _ in tasks.values()), default=-1)
            running = [pid for pid, (a, _) in tasks.items() if a == newest]
            if newest <= self.last_attempt or len(running) < self.n_tasks:
                if self.driver.poll() is not None:
                    return
                self.stop.wait(0.01)  # polling /proc: no event to await here
                continue
            if self.stop.wait(self.rng.uniform(*self.delays)):
                return
            alive = sorted(pid for pid, (a, _) in task_processes(self.driver.pid).items()
                           if a == newest)
            if not alive:
                continue
            victim = self.rng.choice(alive)
            if self.fork_server and self.rng.random() < self.fork_server:
                if self._kill_fork_server(victim, newest):
                    self.last_attempt = newest
                    self.kills += 1
                continue
            if self.hosts and self.rng.random() < self.hosts:
                host = spark_host_of(victim)
                if host is not None:
                    victim = host
                    self.host_kills += 1
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.last_attempt = newest
            self.kills += 1

    def _kill_fork_server(self, task: int, attempt: int) -> bool:
        """SIGKILL the fork server now, or kill ``task`` and then the fork
        server as soon as it forks a task of the next attempt (if it is fast
        enough to fork them all first, it is killed while they run)."""
        servers = fork_servers(self.driver.pid)
        if not servers:
            return False
        if self.rng.random() < 0.5:
            os.kill(servers.pop(), signal.SIGKILL)
            self.fork_server_kills += 1
            return True
        try:
            os.kill(task, signal.SIGKILL)
        except ProcessLookupError:
            return False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.driver.poll() is None:
            newer = [pid for pid, (a, _) in task_processes(self.driver.pid).items()
                     if a > attempt]
            servers = fork_servers(self.driver.pid)
            if newer and servers:
                os.kill(servers.pop(), signal.SIGKILL)
                self.fork_server_kills += 1
                return True
            time.sleep(0.001)
        return True


def run_job(tmp: Path, *, n: int, parallelism: int, keys: int = 2, faults: list | None = None,
            kills: int = 0, seed: int = 0, interval: float = 0.2, timeout: float = 300,
            extra: list[str] | None = None,
            kill_delays: tuple[float, float] = (0.2, 1.0),
            launcher: str = "local", kill_hosts: float = 0.0,
            kill_fork_server: float = 0.0) -> tuple[dict, int]:
    out, chk = tmp / "out", tmp / "chk"
    cmd = [sys.executable, str(HERE / "sums_job.py"), "--n", str(n), "--parallelism",
           str(parallelism), "--keys", str(keys), "--out", str(out), "--storage", str(chk),
           "--interval", str(interval), "--faults", json.dumps(faults or []),
           "--launcher", launcher] + (extra or [])
    return drive(cmd, kills=kills, tasks=parallelism * 2, seed=seed, kill_delays=kill_delays,
                 timeout=timeout, kill_hosts=kill_hosts, kill_fork_server=kill_fork_server)


class Watcher(Protocol):
    """What watches a driven job beside its killer: e.g. a stopper that ends
    the load the job reads once the killer's kills landed."""

    def watch(self, driver: subprocess.Popen, killer: RandomKiller) -> None:
        """Start watching (in a thread of its own); it ends when the driver does."""

    def check(self) -> None:
        """Once the driver ended: wait for the watcher's end and fail with
        what went wrong, if anything did."""


def drive(cmd: list[str], *, kills: int, tasks: int, seed: int,
          kill_delays: tuple[float, float], timeout: float,
          kill_hosts: float = 0.0, kill_fork_server: float = 0.0,
          watcher: Watcher | None = None) -> tuple[dict, int]:
    """Run the driver ``cmd`` while a :class:`RandomKiller` SIGKILLs ``kills``
    of its ``tasks`` tasks (and ``watcher`` watches both); return the
    JobResult it printed last (as a dict) and how many kills happened."""
    driver = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killer = RandomKiller(driver, kills, tasks, seed, *kill_delays, hosts=kill_hosts,
                          fork_server=kill_fork_server)
    if kills:
        killer.start()
    try:
        if watcher is not None:
            watcher.watch(driver, killer)
        stdout, stderr = driver.communicate(timeout=timeout)
    finally:
        killer.stop.set()
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, f"driver failed ({driver.returncode}):\n{stderr[-4000:]}"
    if watcher is not None:
        watcher.check()
    result = json.loads(stdout.strip().splitlines()[-1])
    result["host_kills"] = killer.host_kills  # of killer.kills
    result["fork_server_kills"] = killer.fork_server_kills
    return result, killer.kills
