"""`lockgate stop JOB --savepoint` is synchronous: the savepoint completes, the
sinks commit, then the tasks end. A real driver (`lockgate run`, a
subprocess) is stopped by the CLI (another one) on both launchers, with and
without drain: the folder holds no in-progress or pending file, its
committed lines are exactly the records the driver reported out, and a job
resumed from the savepoint to the end of its input (which commits those
transactions again, idempotently) leaves exactly the expected running sums."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fault.sums_job import build
from tests.fixtures import check_exact_sums, committed_lines, hidden_files
from tests.integration.test_rest import Driver, _cli, _ok

N = 60_000
KEYS = 3
APP = """
from tests.fault.sums_job import build

pipeline = build({n}, 2, {keys}, {out!r}, {chk!r}, 0.2, rate=2000)
"""


@pytest.mark.parametrize("drain", [False, True], ids=["no-drain", "drain"])
def test_stop_with_a_savepoint_commits_before_the_job_ends(tmp_path: Path, launcher: str,
                                                           drain: bool) -> None:
    out, chk = tmp_path / "out", tmp_path / "chk"
    driver = Driver(tmp_path, launcher=launcher,
                    app=APP.format(n=N, keys=KEYS, out=str(out), chk=str(chk)))
    try:
        driver.await_checkpoints(2)
        args = ["stop", driver.job_id, "--savepoint", "--dir", "sp"]
        savepoint = _ok(_cli(tmp_path, *args, *(["--drain"] if drain else []),
                             timeout=120)).strip()
        assert driver.wait(120) == 0, driver.log()
    finally:
        driver.kill()
    summary = driver.stdout()
    found = re.search(r"job \S+ (\w+) in .*: (\d+) records in, (\d+) out", summary)
    assert found, summary
    status, records_in, records_out = found[1], int(found[2]), int(found[3])
    assert status == ("finished" if drain else "stopped"), summary
    assert f"savepoint: {savepoint}" in summary
    assert 0 < records_in < N, "the job ended before it was stopped (machine too slow?)"
    # Nothing left uncommitted: what the job reported out is what it committed.
    assert hidden_files(out) == []
    assert len(committed_lines(out)) == records_out == records_in
    # Resumed to the end: the savepoint's transactions are committed again
    # (idempotently) and nothing is doubled or lost, record by record.
    resumed = build(N, 2, KEYS, str(out), str(chk), 0.2)
    result = resumed.run(launcher=launcher, from_savepoint=savepoint)
    assert result.status == "finished" and result.records_in == N, result
    check_exact_sums(out, N, KEYS)
