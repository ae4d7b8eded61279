"""`lockgate rescale` on a running job (a real driver, `lockgate run`, and
the CLI as subprocesses): the same job, served by the same REST server, runs
at the new parallelism, its checkpoint history goes on; a bad parallelism or
uid is refused with a clear error and the job goes on; a stop with a drained
savepoint then shows the committed output exact across the rescales."""

from __future__ import annotations

from pathlib import Path

from lockgate.web import client
from tests.fixtures import check_running_sums, committed_lines, hidden_files, operator_state
from tests.integration.test_rest import KEYS, Driver, _cli, _ok


def consumed(savepoint: str) -> list[int]:
    """Every number the unbounded source read before ``savepoint``: a rescale
    cuts its splits into strides, so a number is unread when it is at or after
    a split's position, on its stride (the strides left cover the rest)."""
    left = [(s["next"], s["step"]) for entries in operator_state(savepoint, "numbers")
            for s in entries]
    top = max(nxt for nxt, _ in left)
    return [x for x in range(1, top)
            if not any(x >= nxt and (x - nxt) % step == 0 for nxt, step in left)]


def test_cli_rescales_a_running_job_exactly(tmp_path: Path) -> None:
    driver = Driver(tmp_path)
    try:
        driver.await_checkpoints(2)
        job = driver.job_id
        before = client.call(driver.endpoint, "GET", f"/jobs/{job}/checkpoints")["history"]

        assert _ok(_cli(tmp_path, "rescale", job, "3")).strip() == "3"
        status = client.call(driver.endpoint, "GET", f"/jobs/{job}")
        assert status["parallelism"] == 3 and status["restarts"] == 0
        assert set(status["vertex_parallelism"].values()) == {3}
        vertices = client.call(driver.endpoint, "GET", f"/jobs/{job}/vertices")["vertices"]
        assert all(len(v["tasks"]) == 3 for v in vertices)

        refused = _cli(tmp_path, "rescale", job, "0")
        assert refused.returncode == 1 and "1..max_parallelism (128)" in refused.stderr
        refused = _cli(tmp_path, "rescale", job, "--vertex", "nope=2")
        assert refused.returncode == 1 and "no operator of the job has the uid" in refused.stderr
        refused = _cli(tmp_path, "rescale", job, "--vertex", "sums")
        assert refused.returncode == 1 and "--vertex sums=4" in refused.stderr

        # per operator: the keyed sums (and the sink chained with them) at 1
        _ok(_cli(tmp_path, "rescale", job, "--vertex", "sums=1"))
        status = client.call(driver.endpoint, "GET", f"/jobs/{job}")
        assert sorted(status["vertex_parallelism"].values()) == [1, 3]
        driver.await_checkpoints(len([h for h in before if h["status"] == "completed"]) + 4)
        after = client.call(driver.endpoint, "GET", f"/jobs/{job}/checkpoints")["history"]
        ids = [h["id"] for h in after]
        assert ids == sorted(ids) and ids[0] <= before[-1]["id"] < ids[-1]

        stopped = _ok(_cli(tmp_path, "stop", job, "--savepoint", "--drain", "--dir", "sp"))
        assert driver.wait() == 0, driver.log()
    finally:
        driver.kill()
    inputs = consumed(stopped.strip())
    assert len(inputs) > 1000
    check_running_sums(committed_lines(tmp_path / "out"), 0, KEYS, inputs=inputs)
    assert hidden_files(tmp_path / "out") == []
