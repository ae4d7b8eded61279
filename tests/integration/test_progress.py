"""Live progress of `lockgate run` (a real driver and its tasks, local
launcher): on a terminal (a pty) one status line rewrites itself with \\r and
shows a progress bar for a bounded sequence; without one, plain lines; with
--quiet, nothing but the result; the dashboard's URL is printed at the start
(with its token only on a terminal)."""

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
"""
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


def _run_in_pty(tmp: Path, timeout: float = 240) -> str:
    primary, secondary = pty.openpty()
    os.set_blocking(primary, False)
    proc = subprocess.Popen([sys.executable, "-m", "lockgate.cli", "run", str(_app(tmp)),
                             "--launcher", "local"], cwd=tmp, env=_env(tmp),
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
