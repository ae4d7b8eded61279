"""What a running job prints in the terminal (``lockgate run``,
``Pipeline.run``): :func:`run_with_progress`.

Step 1. When it starts: ``job ID starts (N tasks, guarantee ...)``, then
        the dashboard's URL once it is served (with its token only on a
        terminal; elsewhere the command that prints it).
Step 2. While it runs, on a terminal, one status line rewrites itself
        (``\\r``) twice a second: records read and their rate, the last
        checkpoint and its age, restarts, and for a bounded job whose sources
        know their size a progress bar with percent and ETA; log lines
        printed meanwhile clear it first and it is drawn again below them.
        Elsewhere (a pipe, a log file, CI) a line after every completed
        checkpoint and a plain status line every :data:`PLAIN_INTERVAL`
        seconds (``verbose``: the checkpoint lines on a terminal too).
Step 3. When it ends: the status line is cleared and a summary printed
        (:func:`summary_lines`).

The figures are the dashboard's (:meth:`JobMaster.metrics`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from lockgate.cluster.format import format_duration

if TYPE_CHECKING:
    from lockgate.api.result import JobResult, Progress
    from lockgate.cluster.jobmaster import JobMaster

__all__ = ["PLAIN_INTERVAL", "TTY_INTERVAL", "ProgressReporter", "checkpoint_text",
           "run_with_progress", "start_text", "status_text", "summary_lines"]

TTY_INTERVAL = 0.5
"""Seconds between two drawings of the status line."""
PLAIN_INTERVAL = 10.0
"""Seconds between two plain progress lines (not a terminal);
``LOCKGATE_PROGRESS_INTERVAL`` sets either."""
BAR = 20
"""Characters of the progress bar."""


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def status_text(o: dict[str, Any], read: int, rate: float | None, elapsed: float) -> str:
    """One status line from the job's overview (``JobMaster.metrics()``)."""
    job, chk = o["job"], o["checkpoints"]
    parts = [f"{read:,} records" + (f" ({_count(rate)}/s)" if rate is not None else "")]
    size = job.get("size_hint")
    if size:
        done = min(1.0, read / size)
        filled = int(done * BAR)
        eta = (f"ETA {format_duration((size - read) / rate)}" if rate and read < size
               else "ETA -")
        parts = [f"[{'#' * filled}{'.' * (BAR - filled)}] {done * 100:5.1f}%", parts[0], eta]
    last = chk.get("last")
    if last:
        parts.append(f"checkpoint {last['id']} ({format_duration(chk.get('last_age'))} ago)")
    else:
        parts.append("no checkpoint yet")
    if chk.get("failed"):
        parts.append(f"{chk['failed']} failed")
    parts.append(f"{job.get('restarts', 0)} restarts")
    parts.append(f"{elapsed:.0f} s")
    return " · ".join(parts)


def start_text(master: JobMaster) -> str:
    """The line that says the job starts: its id, tasks and guarantee, and
    the commands that control it (when its REST API is on)."""
    job_id = master.job_id
    control = (f"; control it with `lockgate savepoint|stop|cancel|checkpoints {job_id}`"
               if master.rest is not None else "")
    return (f"job {job_id} starts ({master.graph.num_tasks} tasks, guarantee "
            f"{master.guarantee.replace('_', '-')}){control}")


def checkpoint_text(p: Progress) -> str:
    """The line printed after a completed checkpoint."""
    ms = f"{p.last_checkpoint_duration * 1000:.0f} ms" if p.last_checkpoint_duration else "-"
    return (f"[{p.elapsed:7.1f} s] checkpoint {p.last_checkpoint_id} ({ms}): "
            f"{p.records_read:,} records read, {p.records_written:,} written, "
            f"{p.restarts} restarts")


def summary_lines(result: JobResult) -> list[str]:
    """What is printed when the job has ended."""
    lines = [f"job {result.job_id} {result.status} in {result.duration:.1f} s: "
             f"{result.records_in} records in, {result.records_out} out, "
             f"{len(result.completed_checkpoints)} checkpoints, {result.restarts} restarts, "
             f"guarantee {result.guarantee}"]
    if result.savepoint:
        lines.append(f"savepoint: {result.savepoint}")
    if result.local_restores:
        local = sum(r.local for r in result.local_restores)
        lines.append(f"local recovery: {local} keyed state restores from the tasks' local "
                     f"copies, {len(result.local_restores) - local} from the checkpoint storage")
    return lines


class _ClearLine(logging.Filter):
    """Before a log line: clear the status line (drawn again afterwards)."""

    def __init__(self, reporter: ProgressReporter) -> None:
        super().__init__()
        self.reporter = reporter

    def filter(self, record: logging.LogRecord) -> bool:
        self.reporter.clear()
        return True


class ProgressReporter:
    """The thread that shows a job's progress on ``stream``."""

    def __init__(self, master: JobMaster, stream: IO[str], tty: bool,
                 interval: float | None = None) -> None:
        self.master = master
        self.started = False
        """Whether the job's start line was printed."""
        self.stream = stream
        self.tty = tty
        self.interval = interval or _env_interval() or (TTY_INTERVAL if tty else PLAIN_INTERVAL)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._shown = False
        self._samples: deque[tuple[float, int]] = deque(maxlen=20)
        self._started = time.monotonic()
        self._filter = _ClearLine(self)
        self._thread = threading.Thread(target=self._run, daemon=True, name="lockgate-progress")

    def start(self) -> None:
        if self.tty:
            for handler in logging.getLogger().handlers:
                handler.addFilter(self._filter)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.clear()
        for handler in logging.getLogger().handlers:
            handler.removeFilter(self._filter)

    def line(self, text: str) -> None:
        """Print a line of its own (a status line on a terminal is drawn
        again below it)."""
        with self._lock:
            if self._shown:
                self._write("\r\x1b[K")
                self._shown = False
            self._write(text + "\n")

    def checkpoint(self, p: Progress) -> None:
        """After a completed checkpoint (in the job master's thread)."""
        self.line(checkpoint_text(p))

    def clear(self) -> None:
        with self._lock:
            if self._shown:
                self._write("\r\x1b[K")
                self._shown = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self._stop.set()  # the terminal is gone

    def _run(self) -> None:
        announced = False
        while not self._stop.wait(0.1 if not announced else self.interval):
            try:
                if not announced:
                    announced = self._announce()
                    continue
                self._show()
            except Exception:
                logging.getLogger("lockgate.driver").debug("progress failed", exc_info=True)

    def _announce(self) -> bool:
        """Print the dashboard's URL once the job serves it (or runs without)."""
        master = self.master
        if master.dashboard is None and master.state == "created":
            return False
        if master.dashboard is not None:
            url, token = master.dashboard
            shown = f"{url}#token={token}" if self.tty else f"{url} (the token: `lockgate " \
                f"dashboard {master.job_id}` prints the whole URL)"
            with self._lock:
                self._write(f"dashboard: {shown}\n")
        return True

    def _show(self) -> None:
        o = self.master.metrics()
        read = _records_read(self.master, o)
        now = time.monotonic()
        self._samples.append((now, read))
        first = self._samples[0]
        rate = (read - first[1]) / (now - first[0]) if now - first[0] > 0.2 else None
        text = status_text(o, read, rate, now - self._started)
        with self._lock:
            if self.tty:
                columns = _columns(self.stream)
                self._write("\r" + text[:columns - 1] + "\x1b[K")
                self._shown = True
            else:
                self._write(text + "\n")


def _records_read(master: JobMaster, o: dict[str, Any]) -> int:
    """Records the sources read: live (this attempt's reports on top of the
    restored checkpoint's count), never below the acknowledged count."""
    live = sum(t.get("records_in", 0) for v in o["vertices"] if v["source"]
               for t in v["tasks"])
    return max(int(o["job"]["records_read"]), master.coordinator.baseline.read + int(live))


def _env_interval() -> float | None:
    """``LOCKGATE_PROGRESS_INTERVAL``: seconds between two updates, if set."""
    try:
        value = float(os.environ.get("LOCKGATE_PROGRESS_INTERVAL", ""))
    except ValueError:
        return None
    return value if value > 0 else None


def _columns(stream: IO[str]) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        columns = 0
    if columns <= 0:  # a terminal without a size (a bare pty)
        text = os.environ.get("COLUMNS", "")
        columns = int(text) if text.isdigit() and int(text) > 0 else 120
    return columns


def progress_mode(setting: bool | None, stream: IO[str]) -> tuple[bool, bool]:
    """Whether to show progress, and whether on a terminal."""
    if setting is False or (setting is None and os.environ.get(
            "LOCKGATE_PROGRESS", "1").strip().lower() in ("0", "false", "off", "no")):
        return False, False
    try:
        tty = stream.isatty()
    except (OSError, ValueError, AttributeError):
        tty = False
    return True, tty


def run_with_progress(master: JobMaster, setting: bool | None = None,
                      stream: IO[str] | None = None, interval: float | None = None, *,
                      verbose: bool = False, summary: IO[str] | None = None) -> JobResult:
    """``master.run()`` with what it prints (the module's steps) on
    ``stream`` (stderr) as ``setting`` says: None (the default) on unless
    ``LOCKGATE_PROGRESS=0``, False never, True always. ``verbose``: a line
    per checkpoint on a terminal too. ``summary``: where the summary goes,
    whatever ``setting`` says (``lockgate run``: stdout); by default to
    ``stream`` when progress is shown. A job that fails raises, with no
    summary. Ctrl-C ends the job cleanly (:mod:`lockgate.cluster.interrupt`):
    one line says how to resume it, and
    :class:`~lockgate.errors.JobInterrupted` (exit code 130) is raised."""
    from lockgate.cluster.interrupt import on_ctrl_c, resume_line
    from lockgate.errors import JobInterrupted

    stream = stream or sys.stderr
    show, tty = progress_mode(setting, stream)
    reporter = ProgressReporter(master, stream, tty, interval) if show else None
    if reporter is not None:
        reporter.line(start_text(master))
        if verbose or not tty:
            _also_on_checkpoint(master, reporter.checkpoint)
    with on_ctrl_c() as ctrl_c:
        if ctrl_c is not None:
            ctrl_c.attach(master)
        if reporter is not None:
            reporter.start()
        try:
            result = master.run()
        finally:
            if reporter is not None:
                reporter.stop()
    if ctrl_c is not None and ctrl_c.pressed and result.status != "finished":
        print(resume_line(master), file=sys.stderr, flush=True)
        raise JobInterrupted(master.job_id, result.latest_checkpoint)
    out = summary if summary is not None else stream if show else None
    if out is not None:
        try:
            out.write("".join(line + "\n" for line in summary_lines(result)))
            out.flush()
        except (OSError, ValueError):  # the terminal is gone: the result is returned
            pass
    return result


def _also_on_checkpoint(master: JobMaster, call: Callable[[Progress], None]) -> None:
    """Call ``call`` after every completed checkpoint, beside the job's own
    ``on_progress``."""
    own = master.options.on_progress

    def both(p: Progress) -> None:
        call(p)
        if own is not None:
            own(p)

    master.options.on_progress = both
