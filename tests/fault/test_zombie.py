"""Fencing: a task of a failed attempt that is still alive while the next
attempt runs (an executor the driver cannot reach) can neither commit nor
write visible output.

The zombie is real: the sink task of attempt 0 freezes itself with SIGSTOP
right after a checkpoint's completion notice arrived and before it commits
(fault point ``commit``), holding that notice and an open transaction. The
test then SIGKILLs a source task, so the attempt fails; the launcher cannot
reach the frozen task (it spares stopped processes, as a driver cannot kill a
task on a lost executor), so attempt 1 runs beside it. Once attempt 1 has
recovered and completed checkpoints, the zombie is resumed with SIGCONT: it
commits (or tries to) what its notice names, finds the coordinator gone, and
ends by itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

from lockgate.cluster import jobmaster
from lockgate.cluster.local.launcher import LocalLauncher
from lockgate.connectors.filesink_plan import parse_part_name
from tests.fault.checks import process_state
from tests.fault.sums_job import build
from tests.fixtures import check_exact_sums

N = 150_000
SINK_TASK = 2  # parallelism 2: tasks 0-1 are numbers->pairs, 2-3 are sums->out
SOURCE_TASK = 0


class UnreachableStoppedTasks(LocalLauncher):
    """The local launcher, except that it cannot reach a stopped task: ``stop``
    neither kills nor waits for it (a task on an executor the driver lost)."""

    zombies: dict[int, subprocess.Popen[bytes]] = {}
    fork_server = False  # each task a child of ours: its stop is awaited with waitid

    def stop(self) -> None:
        for task, proc in list(self._procs.items()):
            # poll() says None also while the launcher's watcher thread is
            # reaping the process, so the state read may find it gone
            if proc.poll() is None and process_state(proc.pid) == "T":
                UnreachableStoppedTasks.zombies[task] = self._procs.pop(task)
        super().stop()


def _visible_attempt0(out: Path) -> set[str]:
    names = set()
    for f in out.iterdir():
        part = parse_part_name(f.name)
        if part is not None and not part.hidden and part.attempt == 0:
            names.add(f.name)
    return names


def test_a_zombie_of_an_old_attempt_cannot_commit_or_write(tmp_path: Path,
                                                          monkeypatch) -> None:
    monkeypatch.setattr(UnreachableStoppedTasks, "zombies", {})
    launchers: list[UnreachableStoppedTasks] = []

    def make_launcher(name, events):
        launchers.append(UnreachableStoppedTasks(events))
        return launchers[-1]

    monkeypatch.setattr(jobmaster, "make_launcher", make_launcher)
    out = tmp_path / "out"
    p = build(N, 2, 2, str(out), str(tmp_path / "chk"), 0.1, rate=30_000)
    faults = [{"point": "commit", "task": SINK_TASK, "attempt": 0, "count": 2,
               "signal": "SIGSTOP"}]
    attempt1_checkpointed = threading.Event()
    seen: dict[str, object] = {}

    def on_progress(progress) -> None:
        if progress.restarts == 1:
            seen.setdefault("first", progress.checkpoints_completed)
            if progress.checkpoints_completed >= int(seen["first"]) + 2:  # type: ignore[arg-type]
                attempt1_checkpointed.set()

    def conductor() -> None:
        # Step 1. Wait until the sink task of attempt 0 froze itself (an event: waitid).
        while not launchers or SINK_TASK not in launchers[0].pids():
            threading.Event().wait(0.01)  # the processes start right after the job does
        zombie_pid = launchers[0].pids()[SINK_TASK]
        os.waitid(os.P_PID, zombie_pid, os.WSTOPPED | os.WNOWAIT)
        # Step 2. Fail attempt 0: SIGKILL a source task.
        os.kill(launchers[0].pids()[SOURCE_TASK], signal.SIGKILL)
        # Step 3. Attempt 1 runs beside the zombie and completes checkpoints.
        assert attempt1_checkpointed.wait(120), "attempt 1 completed no checkpoint"
        zombie = UnreachableStoppedTasks.zombies[SINK_TASK]
        assert zombie.poll() is None and process_state(zombie.pid) == "T"
        seen["before_resume"] = _visible_attempt0(out)
        # Step 4. Resume the zombie; it must end by itself.
        os.kill(zombie.pid, signal.SIGCONT)
        seen["zombie_exit"] = zombie.wait(60)
        seen["after_zombie"] = _visible_attempt0(out)

    thread = threading.Thread(target=conductor, daemon=True)
    thread.start()
    result = p.run(launcher="local", fault_injection=faults, on_progress=on_progress)
    thread.join(120)
    assert "zombie_exit" in seen, "the zombie was never resumed (the job ended too early?)"
    # the zombie ended by itself (not killed by anyone) ...
    assert isinstance(seen["zombie_exit"], int) and seen["zombie_exit"] >= 0
    # ... and added no visible file of its attempt
    assert seen["after_zombie"] == seen["before_resume"]
    # the output is exactly right, nothing hidden is left
    assert result.restarts == 1, result.failures
    assert (result.records_in, result.records_out) == (N, N)
    check_exact_sums(out, N, 2)
