"""A job run by ``lockgate run`` runs once; a job run again never doubles its
output; Ctrl-C ends a job cleanly and says how to resume it.

Every test runs real driver processes (``python app.py``, ``lockgate run``)
and sends real signals to them as a terminal does (SIGINT to the process
group), and compares the committed output with what one run produces, line
by line. The app is the README's first example (guarded by
``if __name__ == "__main__":``, or not, as the test says)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lockgate.checkpoint import storage
from tests.fault.checks import descendants, task_processes
from tests.fixtures import committed_lines, hidden_files

FIRST = '''
from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, SequenceSource

p = Pipeline("sums-by-remainder", parallelism=2,
             checkpoint=CheckpointConfig(interval={interval}, storage="checkpoints/"))
(p.source(SequenceSource(1, {n}{rate}), uid="numbers")
   .map(lambda x: (x % 100, 1, x), uid="triples")                   # (remainder, count, sum)
   .key_by(lambda t: t[0])
   .reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2]), uid="sums")  # emits every update
   .sink(FileSink("out/"{mode}, format="jsonl"), uid="out"))
'''
GUARDED = 'if __name__ == "__main__":\n    p.run({run})\n'
UNGUARDED = "p.run({run})\n"

LOCKGATE = [sys.executable, "-m", "lockgate.cli"]


def write_app(folder: Path, *, n: int, guarded: bool = True, run: str = "",
              interval: float = 1.0, rate: int | None = None, mode: str | None = None,
              name: str = "first.py") -> Path:
    app = folder / name
    text = FIRST.format(n=f"{n:_}", interval=interval,
                        rate=f", rate={rate}" if rate else "",
                        mode=f", mode={mode!r}" if mode else "")
    app.write_text(text + (GUARDED if guarded else UNGUARDED).format(run=run))
    return app


def check_one_run(lines: list[list[int]], n: int, copies: int = 1) -> None:
    """``lines`` are what one run of the example over 1..n commits (``copies``
    runs): per remainder, the counts 1..N once each, and the sums grow by
    exactly that remainder's numbers (the order in which they arrive
    depends on the parallelism, the sums at the end do not)."""
    assert len(lines) == n * copies, f"{len(lines)} lines for {n} numbers x {copies}"
    by_key: dict[int, list[tuple[int, int]]] = {}
    for k, count, total in lines:
        by_key.setdefault(k, []).append((count, total))
    assert sorted(by_key) == list(range(min(n, 100)))
    for k, entries in by_key.items():
        inputs = list(range(k or 100, n + 1, 100))
        for copy in range(copies):
            got = sorted(entries)[copy::copies]
            assert [c for c, _ in got] == list(range(1, len(inputs) + 1)), f"remainder {k}"
            diffs = [b - a for a, b in zip([0] + [s for _, s in got], [s for _, s in got],
                                           strict=False)]
            assert sorted(diffs) == inputs, f"remainder {k}: the sums do not match"


def run(cmd: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=os.environ.copy())


def python(app: Path) -> list[str]:
    return [sys.executable, app.name]


def job_dirs(folder: Path) -> list[Path]:
    return sorted((folder / "checkpoints").iterdir())


def one_run_committed(folder: Path, n: int) -> None:
    """The output holds exactly the lines one run produces, nothing pending."""
    check_one_run(committed_lines(folder / "out"), n)
    assert hidden_files(folder / "out") == []


# ------------------------------------------------------ lockgate run runs once


def test_lockgate_run_runs_an_unguarded_script_once_with_its_options(tmp_path: Path) -> None:
    """The script calls p.run() (Spark, parallelism 2) at module level:
    lockgate run hands that pipeline to the command line, which runs it once
    with its own options (the local launcher, parallelism 3)."""
    write_app(tmp_path, n=20_000, guarded=False)
    done = run([*LOCKGATE, "run", "first.py", "--parallelism", "3", "--launcher", "local"],
               tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(re.findall(r"^job \S+ finished", done.stdout, re.M)) == 1, done.stdout
    assert done.stderr.count(" starts (6 tasks") == 1, done.stderr  # 2 chains x 3
    assert "spark" not in done.stderr.lower(), done.stderr
    one_run_committed(tmp_path, 20_000)
    assert {name.split("-")[2] for name in os.listdir(tmp_path / "out")} == {"0", "1", "2"}
    assert len(job_dirs(tmp_path)) == 1


def test_lockgate_run_of_the_readme_example(tmp_path: Path) -> None:
    """The README's first example as written (1,000,000 numbers, guarded),
    run by lockgate run with other settings, commits one run's lines."""
    write_app(tmp_path, n=1_000_000)
    done = run([*LOCKGATE, "run", "first.py", "--parallelism", "3", "--launcher", "local"],
               tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    one_run_committed(tmp_path, 1_000_000)


def test_lockgate_run_an_unguarded_script_on_spark(tmp_path: Path) -> None:
    write_app(tmp_path, n=5_000, guarded=False, run='launcher="local"')
    done = run([*LOCKGATE, "run", "first.py", "--parallelism", "1", "--launcher", "spark"],
               tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(" starts (2 tasks") == 1, done.stderr
    one_run_committed(tmp_path, 5_000)


def test_lockgate_run_of_start_and_of_a_main_that_runs(tmp_path: Path) -> None:
    """p.start() at module level, and a main() that calls p.run(): each runs
    once, with the command line's options, and the script gets the result."""
    app = write_app(tmp_path, n=3_000, guarded=False, run="")
    text = app.read_text().replace("p.run()\n", "")
    app.write_text(text + 'job = p.start(launcher="spark")\n'
                   'print("STARTED", job.result().status)\n')
    done = run([*LOCKGATE, "run", "first.py", "--launcher", "local", "--parallelism", "3"],
               tmp_path)
    assert done.returncode == 0, done.stderr
    assert "STARTED finished" in done.stdout and done.stdout.count(" finished in ") == 1
    one_run_committed(tmp_path, 3_000)
    assert len(os.listdir(tmp_path / "out")) == 3
    other = tmp_path / "other"
    other.mkdir()
    app2 = write_app(other, n=2_000, guarded=False, run="")
    body = app2.read_text().replace("p.run()\n", "").strip().splitlines()
    imports, build = body[:2], body[2:]
    app2.write_text("\n".join(imports + ["def main():"] + ["    " + line for line in build]
                              + ["    result = p.run()", "    print('RAN', result.records_out)"])
                    + "\n")
    done = run([*LOCKGATE, "run", "first.py", "--launcher", "local"], other)
    assert done.returncode == 0, done.stderr
    assert "RAN 2000" in done.stdout and done.stdout.count(" finished in ") == 1, done.stdout
    one_run_committed(other, 2_000)


def test_two_pipelines_run_by_one_script_are_refused(tmp_path: Path) -> None:
    app = write_app(tmp_path, n=2_000, guarded=False, run='launcher="local"')
    app.write_text(app.read_text() + (
        'q = Pipeline("second", checkpoint=CheckpointConfig(storage="checkpoints/"))\n'
        'q.source(SequenceSource(1, 10), uid="n").sink(FileSink("out2/"), uid="o")\n'
        'q.run(launcher="local")\n'))
    done = run([*LOCKGATE, "run", "first.py", "--launcher", "local"], tmp_path)
    assert done.returncode == 1, done.stderr
    assert "first.py runs a second pipeline ('second') after 'sums-by-remainder'" \
        in done.stderr and "one job per script" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out2").exists()
    one_run_committed(tmp_path, 2_000)  # the first ran once
    # python runs both, as it always did
    plain = run(python(app), tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert sorted(committed_lines(tmp_path / "out2")) == list(range(1, 11))


# ----------------------------------------------------------- running again


@pytest.mark.parametrize("launcher", ["local", "spark"])
def test_python_app_twice_commits_one_run(tmp_path: Path, launcher: str) -> None:
    """The second run resumes from the first one's final checkpoint, says so
    on one line, and reads nothing new: the output holds one run's lines."""
    n = 1_000_000 if launcher == "spark" else 50_000  # the README's, once
    app = write_app(tmp_path, n=n, run='launcher="local"' if launcher == "local" else "")
    first = run(python(app), tmp_path, timeout=600)
    assert first.returncode == 0, first.stderr
    again = run(python(app), tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr
    lines = [line for line in again.stderr.splitlines() if "resumes from" in line]
    assert len(lines) == 1, again.stderr
    assert re.search(r"job sums-by-remainder-\w{8} resumes from its latest completed "
                     r"checkpoint \S+/chk-\d+, [\d,]+ records read; it had read all its "
                     r"input", lines[0]), lines[0]
    one_run_committed(tmp_path, n)
    assert len(job_dirs(tmp_path)) == 1  # the same job folder, the same job id
    # lockgate run resumes it too (at another parallelism)
    cli = run([*LOCKGATE, "run", "first.py", "--parallelism", "3", "--launcher", "local"],
              tmp_path)
    assert cli.returncode == 0 and "resumes from" in cli.stderr, cli.stderr
    one_run_committed(tmp_path, n)


def test_a_second_copy_is_refused_and_the_choices_work(tmp_path: Path) -> None:
    """Without a checkpoint to resume, a FileSink refuses a folder holding
    its committed output from an earlier run, naming the choices; fresh,
    mode="overwrite" and mode="append" do what they say."""
    app = write_app(tmp_path, n=3_000, run='launcher="local"')
    assert run(python(app), tmp_path).returncode == 0
    committed = sorted(os.listdir(tmp_path / "out"))
    # the checkpoints are gone: nothing to resume
    subprocess.run(["rm", "-r", str(tmp_path / "checkpoints")], check=True)
    refused = run(python(app), tmp_path)
    assert refused.returncode == 1, refused.stderr
    assert "file sink 'out' would write a second copy" in refused.stderr, refused.stderr
    for choice in ("--from-checkpoint", "fresh output folder", 'mode="overwrite"',
                   'mode="append"'):
        assert choice in refused.stderr, refused.stderr
    assert "PipelineDefinitionError" in refused.stderr  # python app.py: the exception
    assert sorted(os.listdir(tmp_path / "out")) == committed  # untouched
    # --fresh alone is refused the same way (the folder still holds a run)
    fresh = run([*LOCKGATE, "run", "first.py", "--fresh"], tmp_path)
    assert fresh.returncode == 1 and "starts afresh" in fresh.stderr, fresh.stderr
    assert "Traceback" not in fresh.stderr  # lockgate run: one line
    # overwrite: one run's lines again
    write_app(tmp_path, n=3_000, run='launcher="local", fresh=True', mode="overwrite")
    assert run(python(app), tmp_path).returncode == 0
    one_run_committed(tmp_path, 3_000)
    # append, started afresh: two copies, as asked
    write_app(tmp_path, n=3_000, run='launcher="local", fresh=True', mode="append")
    assert run(python(app), tmp_path).returncode == 0
    check_one_run(committed_lines(tmp_path / "out"), 3_000, copies=2)


def test_a_resume_the_checkpoint_refuses_names_the_choices(tmp_path: Path) -> None:
    app = write_app(tmp_path, n=3_000, run='launcher="local"')
    assert run(python(app), tmp_path).returncode == 0
    app.write_text(app.read_text().replace('uid="sums"', 'uid="totals"'))  # another graph
    refused = run([*LOCKGATE, "run", "first.py"], tmp_path)
    assert refused.returncode == 1, refused.stderr
    assert "cannot resume its earlier run from" in refused.stderr
    assert "'sums'" in refused.stderr and "fresh=True (lockgate run --fresh)" in refused.stderr
    assert "Traceback" not in refused.stderr
    one_run_committed(tmp_path, 3_000)


def test_a_job_stopped_with_a_savepoint_resumes_from_it(tmp_path: Path) -> None:
    """A stop's savepoint is newer than the job's checkpoints: the next run
    resumes from it (never from an older checkpoint, which would write again
    what the stop committed); a second run while the first still runs is
    refused."""
    n = 20_000
    app = write_app(tmp_path, n=n, interval=0.3, rate=2_000, run='launcher="local"')
    driver = _start(python(app), tmp_path)
    _wait_for_checkpoint(tmp_path, driver, timeout=120)
    job = job_dirs(tmp_path)[0].name
    twice = run(python(app), tmp_path)
    assert twice.returncode == 1 and f"job {job} still runs" in twice.stderr, twice.stderr
    stop = run([*LOCKGATE, "stop", job, "--savepoint", "--dir", "savepoints"], tmp_path)
    assert stop.returncode == 0, stop.stderr
    driver.communicate(timeout=60)
    assert driver.returncode == 0
    savepoint = stop.stdout.strip().splitlines()[-1]
    assert len(committed_lines(tmp_path / "out")) < n
    done = run(python(app), tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"job {job} resumes from its latest completed savepoint {savepoint}" \
        in done.stderr, done.stderr
    one_run_committed(tmp_path, n)


# ---------------------------------------------------------------- Ctrl-C


def _start(cmd: list[str], cwd: Path) -> subprocess.Popen[str]:
    """A driver in its own process group, as a shell runs a foreground job."""
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env=os.environ.copy())


def _wait_for_checkpoint(folder: Path, driver: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert driver.poll() is None, driver.communicate()
        root = folder / "checkpoints"
        if root.exists() and any(storage.completed_checkpoints(d) for d in root.iterdir()):
            return
        time.sleep(0.1)
    raise AssertionError("no checkpoint completed in time")


CASES = [("python", "local"), ("lockgate", "local"), ("python", "spark"),
         ("lockgate", "spark")]


@pytest.mark.parametrize(("entry", "launcher"), CASES, ids=[f"{e}-{la}" for e, la in CASES])
def test_ctrl_c_ends_the_job_and_names_the_command_that_resumes_it(
        tmp_path: Path, entry: str, launcher: str) -> None:
    n = 30_000
    app = write_app(tmp_path, n=n, interval=0.3, rate=2_000,
                    run=f'launcher="{launcher}"' if entry == "python" else "")
    cmd = python(app) if entry == "python" else [
        *LOCKGATE, "run", "first.py", "--launcher", launcher]
    driver = _start(cmd, tmp_path)
    _wait_for_checkpoint(tmp_path, driver, timeout=180)
    os.killpg(driver.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    sent = time.monotonic()
    stdout, stderr = driver.communicate(timeout=60)
    took = time.monotonic() - sent
    assert driver.returncode == 130, stderr
    assert took < 15, f"Ctrl-C took {took:.1f} s"
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if "interrupted" in line]
    assert len(lines) == 1, stderr
    m = re.fullmatch(r"job (\S+) interrupted; latest completed checkpoint: (\S+); "
                     r"resume with: (.+)", lines[0])
    assert m, lines[0]
    checkpoint = Path(m.group(2))
    assert (checkpoint / "_metadata").exists()
    job_dir = checkpoint.parent
    assert storage.latest_completed(job_dir) == str(checkpoint)
    # no incomplete checkpoint folder is left to be taken for a completed one
    assert all(storage.checkpoint_folders(job_dir).values()), os.listdir(job_dir)
    # fewer lines than one run: the job was cut short, and nothing is doubled
    assert len(committed_lines(tmp_path / "out")) < n
    resume = shlex.split(m.group(3))
    if entry == "python":
        assert resume == ["python", "first.py"]
        resume = python(app)
    else:
        assert resume == ["lockgate", "run", "first.py", "--from-checkpoint", str(checkpoint),
                          "--launcher", launcher]
        resume = [*LOCKGATE, *resume[1:]]
    done = run(resume, tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    one_run_committed(tmp_path, n)


def test_a_second_ctrl_c_kills_at_once(tmp_path: Path) -> None:
    """The first Ctrl-C's clean stop is stuck (the fork server that must end
    the tasks is frozen with SIGSTOP): the second one kills the job's tasks
    and the driver at once."""
    n = 40_000
    app = write_app(tmp_path, n=n, interval=0.3, rate=2_000, run='launcher="local"')
    driver = _start(python(app), tmp_path)
    _wait_for_checkpoint(tmp_path, driver, timeout=120)
    tasks = set(task_processes(driver.pid))
    assert len(tasks) == 4
    servers = [pid for pid in descendants(driver.pid) - tasks  # (its forks share its cmdline)
               if b"lockgate.cluster.local.forkserver" in _cmdline(pid)]
    assert len(servers) == 1, servers
    server = servers[0]
    os.kill(server, signal.SIGSTOP)
    try:
        os.killpg(driver.pid, signal.SIGINT)
        time.sleep(1.0)  # a person presses again after a moment
        assert driver.poll() is None, "the first Ctrl-C did not wait for the tasks to end"
        os.killpg(driver.pid, signal.SIGINT)
        sent = time.monotonic()
        driver.wait(timeout=30)  # (the frozen fork server holds its stderr open)
        assert time.monotonic() - sent < 5
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in tasks):
            assert time.monotonic() < deadline, "task processes outlived the driver"
            time.sleep(0.1)
    finally:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.kill(server, sig)
            except ProcessLookupError:
                pass
    _, stderr = driver.communicate(timeout=30)
    assert driver.returncode == 130, stderr
    assert "killed" in stderr and "Traceback" not in stderr, stderr
    # the incomplete checkpoint the kill may leave is not taken for a
    # completed one: running again resumes from the latest completed checkpoint
    done = run(python(app), tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "resumes from" in done.stderr, done.stderr
    one_run_committed(tmp_path, n)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("moment", ["jvm", "job"])
def test_ctrl_c_while_a_spark_job_starts(tmp_path: Path, moment: str) -> None:
    """Ctrl-C while Spark's JVM starts (the job's checks) or while the job's
    stage starts: the same one line, no traceback, exit code 130."""
    app = write_app(tmp_path, n=30_000, interval=0.3, rate=2_000, run='launcher="spark"')
    driver = _start(python(app), tmp_path)

    def started() -> bool:
        if moment == "job":
            root = tmp_path / "checkpoints"
            return root.exists() and any(root.iterdir())
        return any(b"java" in _cmdline(pid) for pid in descendants(driver.pid))

    deadline = time.monotonic() + 120
    while not started():
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, f"the {moment} did not start"
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGINT)
    sent = time.monotonic()
    _, stderr = driver.communicate(timeout=60)
    assert driver.returncode == 130, stderr
    assert time.monotonic() - sent < 30
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert len([line for line in stderr.splitlines() if "interrupted" in line]) == 1, stderr
