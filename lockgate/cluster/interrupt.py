"""Ctrl-C while a job runs in the foreground (``Pipeline.run``, ``lockgate run``).

The first SIGINT cancels the job: its tasks end at once, and the committed
output is what its latest completed checkpoint committed (two-phase-commit
sinks' later transactions stay pending, for a resume to decide). When the
job has ended, one line names that checkpoint and the command that resumes
it, and :class:`~lockgate.errors.JobInterrupted` ends the program with code
130. A second SIGINT kills the job's task processes, every other process the
driver started for the job (:func:`at_kill`: a Spark session's JVM, Spark's
Python daemon and its workers, a class-data archive build) and the driver at
once. Only the main thread receives signals: elsewhere (``Pipeline.start``, a
job run from another thread) nothing is installed.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from lockgate import fs

if TYPE_CHECKING:
    from concurrent.futures import Future

    from lockgate.cluster.coordinator import CheckpointCoordinator
    from lockgate.cluster.options import RunOptions


class Processes(Protocol):
    """A launcher, as a second Ctrl-C sees it: the processes to kill."""

    def pids(self) -> dict[int, int]: ...


class InterruptedJob(Protocol):
    """What Ctrl-C uses of the job master: cancel the job, kill its tasks,
    name the checkpoint that resumes it."""

    @property
    def job_id(self) -> str: ...

    @property
    def launcher(self) -> Processes | None: ...

    @property
    def coordinator(self) -> CheckpointCoordinator: ...

    @property
    def options(self) -> RunOptions: ...

    def submit(self, kind: str, **args: Any) -> Future[dict[str, Any]]: ...

__all__ = ["CtrlC", "at_kill", "descendants", "kill_tree", "on_ctrl_c", "pressed", "python_command",
           "reassert", "resume_line"]


class CtrlC:
    """The SIGINT handler from a job's submission to its end."""

    def __init__(self) -> None:
        self.pressed = 0
        self.master: InterruptedJob | None = None

    def attach(self, master: InterruptedJob) -> None:
        """The job now has its master: a Ctrl-C pressed before cancels it."""
        self.master = master
        if self.pressed:
            self._start_cancel()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.pressed += 1
        if self.pressed > 1:
            self._kill_now()
        # no print() here: the interrupted code may be writing to stderr
        job = f"job {self.master.job_id}" if self.master is not None else "the job"
        _say(f"\nstopping {job} (Ctrl-C again to kill it at once)\n")
        if self.master is not None:
            self._start_cancel()

    def _start_cancel(self) -> None:
        threading.Thread(target=self._cancel, daemon=True, name="lockgate-ctrl-c").start()

    def _cancel(self) -> None:
        assert self.master is not None
        try:
            self.master.submit("cancel")
        except Exception as e:  # the job ended meanwhile
            _say(f"could not cancel job {self.master.job_id}: {e}\n")

    def _kill_now(self) -> None:
        launcher = self.master.launcher if self.master is not None else None
        try:
            pids = list(launcher.pids().values()) if launcher is not None else []
        except Exception:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for kill in list(_at_kill):
            try:
                kill()
            except Exception:  # the rest is killed all the same
                pass
        job = f"job {self.master.job_id}" if self.master is not None else "the job"
        _say(f"\n{job} killed\n")
        os._exit(130)


_at_kill: list[Callable[[], None]] = []


def at_kill(kill: Callable[[], None]) -> None:
    """Have a second Ctrl-C call ``kill`` before the driver exits: it ends
    at once the processes its module started for the job (children of this
    process the driver's exit alone would not end at once, or at all). Runs
    in the signal handler: no locks, no waiting."""
    if kill not in _at_kill:
        _at_kill.append(kill)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` (a child of this process, not reaped yet: its number
    cannot be another process's) and every process below it, read from
    ``/proc`` first, so that those its death would orphan are known. A
    process that leads a process group of its own (Spark's Python daemon
    makes one for its workers) is killed with its whole group: a worker
    forked meanwhile is in it."""
    below = descendants(pid)
    for target in (pid, *below):
        try:
            if os.getpgid(target) == target:
                os.killpg(target, signal.SIGKILL)
            else:
                os.kill(target, signal.SIGKILL)
        except OSError:  # gone meanwhile
            pass


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before their children."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop(0)
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in threads:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except (OSError, ValueError):
                continue
            for child in children:
                if child not in found and child != pid:
                    found.append(child)
                    todo.append(child)
    return found


def _say(text: str) -> None:
    try:
        os.write(2, text.encode())
    except OSError:
        pass


_active: list[CtrlC] = []


@contextmanager
def on_ctrl_c(pressed: bool = False) -> Iterator[CtrlC | None]:
    """Ctrl-C handling while the block runs (main thread only; None
    elsewhere). Nested blocks share the outermost handler. ``pressed``:
    the block handles a Ctrl-C already (a ``KeyboardInterrupt``), so the
    next one kills at once."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    if _active:
        signal.signal(signal.SIGINT, _active[-1])
        _active[-1].pressed = max(_active[-1].pressed, int(pressed))
        yield _active[-1]
        return
    handler = CtrlC()
    handler.pressed = int(pressed)
    previous = signal.signal(signal.SIGINT, handler)
    _active.append(handler)
    try:
        yield handler
    finally:
        _active.remove(handler)
        signal.signal(signal.SIGINT, previous)


def reassert() -> None:
    """After something installed its own SIGINT handler (PySpark's context
    does: it raises ``KeyboardInterrupt`` anywhere): ours again."""
    if _active and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _active[-1])


def pressed() -> bool:
    """Whether Ctrl-C was pressed since the handler was installed."""
    return bool(_active) and _active[-1].pressed > 0


def python_command(path: str | None) -> str:
    """``python app.py args``: this process's command line; it resumes the
    job by itself when the job names no checkpoint (``path`` is ignored)."""
    return " ".join(["python", *(shlex.quote(a) for a in sys.argv)])


def resume_line(master: InterruptedJob) -> str:
    """The one line printed when Ctrl-C ended the job."""
    latest = master.coordinator.latest
    path = fs.redact(str(latest.path)) if latest is not None else None
    options = master.options
    if options.resume_command is not None:
        command = options.resume_command(path)
    elif options.from_checkpoint or options.from_savepoint or options.fresh:
        if options.resumed:
            command = python_command(path)
        else:  # the script starts from a fixed point: name the latest one instead
            script = sys.argv[0] if sys.argv and sys.argv[0] else "app.py"
            command = shlex.join(["lockgate", "run", script, "--from-checkpoint", path]) \
                if path else python_command(None)
    else:
        command = python_command(path)
    if path is None:
        return (f"job {master.job_id} interrupted before its first checkpoint completed "
                f"(nothing committed); run it again with: {command}")
    return (f"job {master.job_id} interrupted; latest completed checkpoint: {path}; "
            f"resume with: {command}")
