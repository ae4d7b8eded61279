"""Job control while a job runs: a real driver (`lockgate run`, a subprocess)
serves its REST API, and the `lockgate` CLI (more subprocesses) finds it
through the discovery file and lists it, prints its checkpoint history, takes
and inspects a savepoint, stops it with a drained savepoint, and a resumed
run continues it — the committed output exact across both runs. The API needs
its token and listens on 127.0.0.1 only; cancel ends a job."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from lockgate.checkpoint import storage
from lockgate.connectors import SequenceSource
from lockgate.web import client, discovery
from tests.fixtures import check_running_sums, committed_lines, hidden_files, operator_state

REPO = Path(__file__).resolve().parents[2]
PARALLELISM = 2
KEYS = 3
APP = """
from tests.fault.sums_job import build

# unbounded: the numbers run until the job is stopped
pipeline = build(None, {parallelism}, {keys}, {out!r}, {chk!r}, 0.2, rate=4000)
"""


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ, LOCKGATE_HOME=str(home), PYTHONPATH=str(REPO))
    env.pop("LOCKGATE_REST", None)
    return env


def _app(tmp: Path, text: str | None = None) -> Path:
    app = tmp / "app.py"
    app.write_text(text if text is not None else APP.format(
        parallelism=PARALLELISM, keys=KEYS, out=str(tmp / "out"), chk=str(tmp / "chk")))
    return app


def _cli(tmp: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lockgate.cli", *args], cwd=tmp,
                          env=_env(tmp / "home"), capture_output=True, text=True,
                          timeout=timeout)


class Driver:
    """`lockgate run app.py --launcher local ...` in the background."""

    def __init__(self, tmp: Path, *extra: str, launcher: str = "local",
                 app: str | None = None) -> None:
        """``app``: the job script's text (default: the unbounded running sums)."""
        self.tmp = tmp
        self.home = tmp / "home"
        self.jobs = self.home / "jobs"
        before = set(self.jobs.glob("*.json")) if self.jobs.exists() else set()
        n = len(list(tmp.glob("driver-*.out")))
        self.out_path, self.err_path = tmp / f"driver-{n}.out", tmp / f"driver-{n}.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lockgate.cli", "run", str(_app(tmp, app)),
                 "--launcher", launcher, *extra],
                cwd=tmp, env=_env(self.home), stdout=out, stderr=err, text=True)
        try:
            self.discovery = _await(lambda: next(iter(set(self.jobs.glob("*.json")) - before),
                                                 None) if self.jobs.exists() else None,
                                    120, "the driver's discovery file", self)
        except BaseException:
            self.kill()
            raise
        self.job_id = self.discovery.stem
        d = json.loads(self.discovery.read_text())
        self.endpoint = discovery.JobEndpoint(d["job_id"], d["name"], d["pid"], d["url"],
                                         d["token"], d["started_at"], self.discovery)

    def completed_checkpoints(self) -> int:
        answer = client.call(self.endpoint, "GET", f"/jobs/{self.job_id}/checkpoints")
        return int(answer["counts"]["completed"])

    def await_checkpoints(self, count: int) -> None:
        _await(lambda: True if self.completed_checkpoints() >= count else None, 60,
               f"{count} completed checkpoints", self)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the driver did not end:\n{self.log()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stdout(self) -> str:
        return self.out_path.read_text()

    def log(self) -> str:
        return self.out_path.read_text() + self.err_path.read_text()[-4000:]


def _await(poll, timeout: float, what: str, driver: Driver | None = None):
    """Poll until ``poll()`` returns something (a deadline, not a sleep as sync)."""
    deadline = time.monotonic() + timeout
    while (value := poll()) is None:
        if driver is not None and driver.proc.poll() is not None:
            raise AssertionError(f"the driver ended ({driver.proc.returncode}) while "
                                 f"waiting for {what}:\n{driver.log()}")
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)
    return value


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _consumed(savepoint: str) -> list[int]:
    """Every number the unbounded source read before ``savepoint``: per split,
    from its first number up to the position the savepoint holds (its
    `_metadata` names the state files; msgpack, read without running code)."""
    first = {s["split"]: s["next"] for s in SequenceSource(1).splits(PARALLELISM)}
    numbers: list[int] = []
    for entries in operator_state(savepoint, "numbers"):
        for split in entries:
            numbers += range(first[split["split"]], split["next"], split["step"])
    return numbers


def test_cli_controls_a_running_job_and_resumes_it_exactly(tmp_path: Path) -> None:
    driver = Driver(tmp_path)
    try:
        driver.await_checkpoints(2)
        job = driver.job_id

        listed = _ok(_cli(tmp_path, "list"))
        assert job in listed and "running" in listed and str(driver.proc.pid) in listed
        assert [j["id"] for j in json.loads(_ok(_cli(tmp_path, "list", "--json")))] == [job]
        # the end-to-end guarantee the job's parts allow, in both views
        assert "GUARANTEE" in listed.splitlines()[0] and "exactly_once" in listed
        assert client.call(driver.endpoint, "GET", f"/jobs/{job}")["guarantee"] == "exactly_once"

        # checkpoint history with alignment times (the keyed tasks have 2 inputs)
        table = _ok(_cli(tmp_path, "checkpoints", job[:8]))  # a unique prefix is enough
        assert "ALIGNMENT" in table.splitlines()[0] and "completed" in table
        assert table.splitlines()[0].rstrip().endswith("REASON")
        history = json.loads(_ok(_cli(tmp_path, "checkpoints", job, "--json")))["history"]
        done = [h for h in history if h["status"] == "completed"]
        assert done and all(isinstance(h["alignment"], float) and h["alignment"] >= 0
                            for h in done)
        tasks = 2 * PARALLELISM
        assert all(len(h["ack_times"]) == tasks and len(h["alignments"]) == tasks
                   for h in done)
        assert all(h["alignment"] == max(h["alignments"].values()) for h in done)
        # aligned checkpoints store no in-flight data (unaligned ones: tests/unit/test_metrics.py)
        assert "IN FLIGHT" in table.splitlines()[0]
        assert all(h["in_flight"] == 0 for h in done)

        # a savepoint while the job goes on, described without running code
        savepoint = _ok(_cli(tmp_path, "savepoint", job, "--dir", "sp")).strip()
        assert Path(savepoint).parent == tmp_path / "sp"
        text = _ok(_cli(tmp_path, "savepoint", "inspect", savepoint))
        assert "parallelism 2" in text and "keyed reduce (value)" in text, text
        info = json.loads(_ok(_cli(tmp_path, "savepoint", "inspect", savepoint, "--json")))
        ops = {o["uid"]: o for o in info["operators"]}
        assert set(ops) == {"numbers", "pairs", "sums", "out"}
        assert info["kind"] == "savepoint" and info["parallelism"] == PARALLELISM
        assert ops["sums"]["keyed_states"] and 0 < ops["sums"]["key_groups"] <= KEYS
        assert ops["numbers"]["operator_state_bytes"] > 0 and info["files"] == "ok"
        assert info["size"] == sum(o["size"] for o in info["operators"]) > 0

        # stop with a drained savepoint: the driver ends, everything committed
        stopped = _ok(_cli(tmp_path, "stop", job, "--savepoint", "--drain", "--dir", "sp"))
        first = stopped.strip()
        assert storage.read_metadata(first).kind == "savepoint"
        assert driver.wait() == 0, driver.log()
        assert f"savepoint: {first}" in driver.stdout()
        assert not driver.discovery.exists()
        assert hidden_files(tmp_path / "out") == []
    finally:
        driver.kill()

    # resume from it, then stop again: both runs together committed each
    # running sum exactly once
    resumed = Driver(tmp_path, "--from-savepoint", first)
    try:
        assert resumed.job_id != job
        resumed.await_checkpoints(1)
        second = _ok(_cli(tmp_path, "stop", resumed.job_id, "--savepoint", "--drain",
                          "--dir", "sp")).strip()
        assert resumed.wait() == 0, resumed.log()
    finally:
        resumed.kill()
    inputs = _consumed(second)
    assert len(inputs) > len(_consumed(first)) > 0
    check_running_sums(committed_lines(tmp_path / "out"), 0, KEYS, inputs=inputs)
    assert hidden_files(tmp_path / "out") == []


def test_spark_launcher_job_is_served_and_stops_with_a_savepoint(tmp_path: Path) -> None:
    """The default launcher: the same commands; stop without drain ends the
    job once its sinks committed (tests/integration/test_stop.py)."""
    driver = Driver(tmp_path, launcher="spark")
    try:
        driver.await_checkpoints(1)
        assert driver.job_id in _ok(_cli(tmp_path, "list"))
        history = json.loads(_ok(_cli(tmp_path, "checkpoints", driver.job_id, "--json")))
        assert all(isinstance(h["alignment"], float) for h in history["history"]
                   if h["status"] == "completed")
        savepoint = _ok(_cli(tmp_path, "stop", driver.job_id, "--savepoint", "--dir",
                             "sp")).strip()
        assert driver.wait(120) == 0, driver.log()
        assert f"job {driver.job_id} stopped" in driver.stdout()
    finally:
        driver.kill()
    info = json.loads(_ok(_cli(tmp_path, "savepoint", "inspect", savepoint, "--json")))
    assert info["kind"] == "savepoint" and not info["final"] and info["files"] == "ok"


def _get(url: str, headers: dict[str, str]) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
        assert body["errors"], body
        return e.code


def _listening_addresses(port: int) -> set[str]:
    """The local addresses listening on ``port`` (from /proc/net/tcp{,6})."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hexport = local.partition(":")
                if state == "0A" and int(hexport, 16) == port:  # LISTEN
                    found.add(address)
    return found


def test_token_localhost_unknown_job_and_cancel(tmp_path: Path) -> None:
    driver = Driver(tmp_path)
    try:
        ep = driver.endpoint
        # the discovery file: only its owner reads it (it holds the token)
        assert stat.S_IMODE(driver.discovery.stat().st_mode) == 0o600
        assert stat.S_IMODE(driver.jobs.stat().st_mode) == 0o700
        assert json.loads(driver.discovery.read_text())["pid"] == driver.proc.pid

        url = f"{ep.url}/jobs/{driver.job_id}"
        assert _get(url, {}) == 401
        assert _get(url, {"Authorization": "Bearer " + "x" * len(ep.token)}) == 401
        assert _get(url, {"Authorization": ep.token}) == 401  # not a bearer header
        assert _get(url, {"Authorization": f"Bearer {ep.token}"}) == 200
        assert _get(f"{ep.url}/jobs/nope", {"Authorization": f"Bearer {ep.token}"}) == 404

        port = int(ep.url.rpartition(":")[2])
        assert ep.url.startswith("http://127.0.0.1:")
        assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1 only

        unknown = _cli(tmp_path, "savepoint", "no-such-job", "--dir", "sp")
        assert unknown.returncode == 1
        assert "error: no running job 'no-such-job'" in unknown.stderr
        assert driver.job_id in unknown.stderr and "lockgate list" in unknown.stderr
        no_flag = _cli(tmp_path, "stop", driver.job_id)
        assert no_flag.returncode == 1 and "--savepoint" in no_flag.stderr
        assert "lockgate cancel" in no_flag.stderr

        cancelled = _ok(_cli(tmp_path, "cancel", driver.job_id))
        assert f"job {driver.job_id} cancelled" in cancelled
        assert driver.wait() == 0, driver.log()
        assert f"job {driver.job_id} cancelled" in driver.stdout()
        assert not driver.discovery.exists()
    finally:
        driver.kill()
    gone = _cli(tmp_path, "checkpoints", driver.job_id)
    assert gone.returncode == 1 and "error: no running Lockgate job" in gone.stderr
    assert "lockgate run" in gone.stderr


def test_discovery_files_of_dead_drivers_are_pruned(tmp_path: Path) -> None:
    jobs = tmp_path / "home" / "jobs"
    jobs.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = jobs / "old-job.json"
    stale.write_text(json.dumps({"job_id": "old-job", "pid": dead.pid, "url": "http://x",
                                 "token": "t" * 20}))
    listed = _cli(tmp_path, "list")
    assert listed.returncode == 0 and "no running jobs" in listed.stderr
    assert not stale.exists()


def test_one_server_serves_every_job_of_a_driver_process(tmp_path: Path, monkeypatch) -> None:
    """Jobs started in one process share its server (and its token); a job run
    with rest=False is neither served nor discovered; the server stops after the
    last job and the next job binds the same fixed port again."""
    from lockgate import RestConfig
    from tests.fault.sums_job import build

    monkeypatch.setenv("LOCKGATE_HOME", str(tmp_path / "home"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = RestConfig(port=port, token="t" * 32)

    def start(name: str, served: RestConfig | bool):
        p = build(None, 1, 2, str(tmp_path / name / "out"), str(tmp_path / name / "chk"), 0.2,
                  rate=2000)
        return p.start(launcher="local", rest=served)

    def discovered(ids: set[str]) -> list[discovery.JobEndpoint]:
        def poll() -> list[discovery.JobEndpoint] | None:
            found = discovery.discover()
            return found if {e.job_id for e in found} == ids else None

        return _await(poll, 30, f"discovery files of {sorted(ids)}")

    a, b, hidden = start("a", config), start("b", config), start("c", False)
    try:
        endpoints = discovered({a.job_id, b.job_id})
        assert {e.url for e in endpoints} == {f"http://127.0.0.1:{port}"}
        served = client.call(endpoints[0], "GET", "/jobs")["jobs"]
        assert {j["id"] for j in served} == {a.job_id, b.job_id}
        assert a.cancel(60).status == "cancelled"
        endpoints = discovered({b.job_id})
        assert [j["id"] for j in client.call(endpoints[0], "GET", "/jobs")["jobs"]] == [b.job_id]
    finally:
        for job_client in (a, b, hidden):
            job_client.master.submit("cancel")
            job_client.result(60)
    again = start("d", config)
    try:
        assert discovered({again.job_id})[0].url == f"http://127.0.0.1:{port}"
    finally:
        assert again.cancel(60).status == "cancelled"
    assert discovery.discover() == []
