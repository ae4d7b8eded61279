"""What `lockgate run` and `python app.py` (`Pipeline.run`) print (a real
driver and its tasks, local launcher): the start and the dashboard's URL
(with its token only on a terminal); on a terminal (a pty) one status line
that rewrites itself with \\r and shows a progress bar for a bounded
sequence, then the summary; without one, a line per checkpoint, plain status
lines and the summary; with --quiet (progress=False), nothing but lockgate
run's result."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
APP = """
from tests.fault.sums_job import build

pipeline = build({n}, 1, 3, {out!r}, {chk!r}, 0.3, rate={rate})

if __name__ == "__main__":
    import sys

    pipeline.run(launcher="local", progress=False if "quiet" in sys.argv else None)
"""
SUMMARY = (r"job \S+ finished in [\d.]+ s: {n} records in, \d+ out, [1-9]\d* checkpoints, "
           r"0 restarts, guarantee exactly_once")
START = r"job \S+ starts \(\d+ tasks, guarantee exactly-once\); control it with"
N = 30_000
RATE = 8_000  # about 4 s of input


def _app(tmp: Path) -> Path:
    app = tmp / "app.py"
    app.write_text(APP.format(n=N, out=str(tmp / "out"), chk=str(tmp / "chk"), rate=RATE))
    return app


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ, LOCKGATE_HOME=str(tmp / "home"), PYTHONPATH=str(REPO),
               LOCKGATE_PROGRESS_INTERVAL="0.5", COLUMNS="200")
    for name in ("LOCKGATE_REST", "LOCKGATE_PROGRESS"):
        env.pop(name, None)
    return env


def _run_in_pty(tmp: Path, timeout: float = 240, argv: list[str] | None = None) -> str:
    primary, secondary = pty.openpty()
    os.set_blocking(primary, False)
    argv = argv or ["-m", "lockgate.cli", "run", str(_app(tmp)), "--launcher", "local"]
    proc = subprocess.Popen([sys.executable, *argv], cwd=tmp, env=_env(tmp),
                            stdin=secondary, stdout=secondary, stderr=secondary)
    os.close(secondary)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk and proc.poll() is not None:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(30) == 0, out.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(primary)
    return out.decode(errors="replace")


def test_on_a_terminal_one_status_line_rewrites_itself_with_a_progress_bar(
        tmp_path: Path) -> None:
    text = _run_in_pty(tmp_path)
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/ui#token=\S{16,}", text), text
    redraws = re.findall(r"\r([^\r\n]*records[^\r\n]*)\x1b\[K", text)
    assert len(redraws) >= 3, text  # the same line, drawn again and again
    assert any(re.search(r"\[#+\.*\]\s+\d+\.\d%", r) and "ETA" in r for r in redraws), redraws
    assert any("checkpoint" in r and "ago" in r for r in redraws), redraws
    # the line is cleared before the result is printed: the result starts a line
    assert re.search(rf"\r\x1b\[K(\r?\n)?job \S+ finished in [\d.]+ s: {N} records in", text), \
        text[-600:]
    # no status line scrolled: every status text ends with the clear, never a newline
    assert not re.search(r"records \([^)]*\)[^\r\n]*\n", text.split("finished in")[0]), text


def test_without_a_terminal_it_prints_plain_lines_and_quiet_prints_none(
        tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "lockgate.cli", "run", str(_app(tmp_path)),
                          "--launcher", "local"], cwd=tmp_path, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    assert "\r" not in run.stderr and "\x1b[" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if " records" in line and "%" in line]
    assert len(lines) >= 2, run.stderr
    assert "dashboard: http://127.0.0.1:" in run.stderr
    assert "#token=" not in run.stderr  # a log file does not get the token
    assert f"{N} records in" in run.stdout

    second = tmp_path / "quiet"
    second.mkdir()
    quiet = subprocess.run([sys.executable, "-m", "lockgate.cli", "run", str(_app(second)),
                            "--launcher", "local", "--quiet"], cwd=second,
                           env=_env(second), capture_output=True, text=True, timeout=240)
    assert quiet.returncode == 0, quiet.stderr
    assert "records" not in quiet.stderr and "dashboard" not in quiet.stderr, quiet.stderr
    assert f"{N} records in" in quiet.stdout


def test_python_app_on_a_terminal_rewrites_its_status_line_and_ends_with_the_summary(
        tmp_path: Path) -> None:
    text = _run_in_pty(tmp_path, argv=[str(_app(tmp_path))])
    assert re.search(START, text), text[:600]
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/ui#token=\S{16,}", text), text
    redraws = re.findall(r"\r([^\r\n]*records[^\r\n]*)\x1b\[K", text)
    assert len(redraws) >= 3, text
    # the status line is cleared, and the summary is the last line
    assert re.search(r"\r\x1b\[K" + SUMMARY.format(n=N) + r"\r?\n$", text), text[-600:]
    assert "] checkpoint " not in text  # on a terminal the status line says it


def test_python_app_piped_prints_checkpoint_lines_and_the_summary(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(_app(tmp_path))], cwd=tmp_path,
                         env=_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    assert "\r" not in run.stderr and "\x1b[" not in run.stderr
    lines = run.stderr.splitlines()
    assert re.match(START, lines[0]), lines[:3]
    assert re.match(r"dashboard: http://127\.0\.0\.1:\d+/ui \(the token: `lockgate dashboard "
                    r"\S+` prints the whole URL\)$", lines[1]), lines[:3]
    checkpoints = [line for line in lines if re.match(
        r"\[\s*[\d.]+ s\] checkpoint \d+ \(\d+ ms\): [\d,]+ records read, [\d,]+ written, "
        r"0 restarts$", line)]
    assert len(checkpoints) >= 2, run.stderr
    assert [line for line in lines if " records" in line and "%" in line], run.stderr
    assert re.fullmatch(SUMMARY.format(n=N), lines[-1]), lines[-3:]
    assert run.stdout == ""  # the app's stdout is its own

    second = tmp_path / "quiet"
    second.mkdir()
    quiet = subprocess.run([sys.executable, str(_app(second)), "quiet"], cwd=second,
                           env=_env(second), capture_output=True, text=True, timeout=240)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "" and quiet.stdout == "", quiet.stderr


def test_verbose_on_a_terminal_adds_a_line_per_checkpoint_above_the_status_line(
        tmp_path: Path) -> None:
    text = _run_in_pty(tmp_path, argv=["-m", "lockgate.cli", "-v", "run",
                                       str(_app(tmp_path)), "--launcher", "local"])
    # each checkpoint line is a line of its own (the status line cleared
    # before it, or before the log line above it)
    lines = re.findall(r"(?:\n|\x1b\[K)(\[\s*[\d.]+ s\] checkpoint \d+ \(\d+ ms\): [\d,]+ "
                       r"records read, [\d,]+ written, 0 restarts)\r?\n", text)
    assert len(lines) >= 2, text[-2000:]
    assert len(re.findall(r"\r([^\r\n]*records \([^\r\n]*)\x1b\[K", text)) >= 2, text[-2000:]
    assert re.search(SUMMARY.format(n=N) + r"\r?\n$", text), text[-600:]
