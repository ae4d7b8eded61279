"""A second Ctrl-C on a job of the Spark launcher leaves no process of the
job behind: not the driver's JVM (the local cluster is inside it), not Spark's
Python daemon and its workers, not the class-data archive build a first
session starts in a session of its own.

The driver runs as a real process (``python app.py``) and gets real SIGINTs.
Every process the job starts inherits a marker in its environment: the test
finds the job's processes by it (they need not be the driver's descendants
any more), and kills any it finds left at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from lockgate.checkpoint import storage

APP = '''
from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, SequenceSource

p = Pipeline("ctrl-c-twice", parallelism=2,
             checkpoint=CheckpointConfig(interval=0.3, storage="checkpoints/"))
(p.source(SequenceSource(1, 10_000_000, rate=2_000), uid="numbers")
   .key_by(lambda x: x % 7)
   .reduce(lambda a, b: a + b, uid="sums")
   .sink(FileSink("out/", format="jsonl"), uid="out"))

if __name__ == "__main__":
    p.run(launcher="spark")
'''

MARK = "LOCKGATE_TEST_CTRL_C_JOB"


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _state(pid: int) -> str | None:
    stat = _read(f"/proc/{pid}/stat")
    return stat.rsplit(b")", 1)[-1].split()[0].decode() if stat else None


def job_processes(mark: str) -> dict[int, str]:
    """Every live process whose environment carries ``MARK=mark``: its command line."""
    needle = f"{MARK}={mark}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if needle in _read(f"/proc/{pid}/environ").split(b"\0") \
                and _state(pid) not in (None, "Z"):
            found[pid] = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode()[:160]
    return found


def _kill_all(mark: str) -> None:
    for pid in job_processes(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_second_ctrl_c_leaves_no_process_of_a_spark_job(tmp_path: Path) -> None:
    """The first Ctrl-C's clean stop cannot end: the driver's JVM is frozen
    (SIGSTOP, as in a long pause), and the job's end waits for its Spark
    stage. The second Ctrl-C exits at once with code 130, and every process
    of the job is gone within seconds: the frozen JVM reads no end of its
    stdin, so only a kill ends it. The cache folder is new, so the first
    session starts the class-data archive build (in a session of its own,
    where Java has a base archive to extend): it goes too."""
    (tmp_path / "app.py").write_text(APP)
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env.update({MARK: mark, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    driver = subprocess.Popen([sys.executable, "app.py"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)  # a foreground job of a shell
    lines: list[str] = []
    stopping = threading.Event()

    def read_stderr() -> None:  # (the JVM holds the pipe open after the driver exits)
        assert driver.stderr is not None
        for raw in driver.stderr:
            line = raw.decode(errors="replace")
            lines.append(line)
            if "Ctrl-C again to kill it at once" in line:
                stopping.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    jvm = None
    try:
        deadline = time.monotonic() + 240
        while True:
            assert driver.poll() is None, "".join(lines)[-3000:]
            root = tmp_path / "checkpoints"
            if root.exists() and any(storage.completed_checkpoints(d) for d in root.iterdir()):
                break
            assert time.monotonic() < deadline, "no checkpoint completed in time"
            time.sleep(0.1)
        before = job_processes(mark)
        jvms = [pid for pid, cmd in before.items()
                if "java" in cmd and _read(f"/proc/{pid}/stat").rsplit(b")", 1)[-1].split()[1]
                == str(driver.pid).encode()]
        assert len(jvms) == 1, before
        jvm = jvms[0]
        os.kill(jvm, signal.SIGSTOP)

        os.kill(driver.pid, signal.SIGINT)
        assert stopping.wait(60), "".join(lines)[-3000:]
        assert driver.poll() is None, "the first Ctrl-C ended the job: the JVM was not needed"
        os.kill(driver.pid, signal.SIGINT)
        sent = time.monotonic()
        code = driver.wait(timeout=60)
        took = time.monotonic() - sent
        assert code == 130, "".join(lines)[-3000:]
        assert took < 15, f"the second Ctrl-C took {took:.1f} s"

        deadline = time.monotonic() + 30
        left = job_processes(mark)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = job_processes(mark)
        assert not left, f"left after the second Ctrl-C: {left} (of {before})"
        reader.join(10)
        text = "".join(lines)
        assert "job ctrl-c-twice-" in text and " killed\n" in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    finally:
        _kill_all(mark)
        if driver.poll() is None:
            driver.kill()
        driver.wait()
