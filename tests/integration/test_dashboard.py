"""The dashboard and /metrics of a live job: a real driver and its task
processes (local launcher) run the running-sums job, one task is killed once
(a restart with its cause), a savepoint is taken, and

* Debian's chromium (headless, driven by selenium and chromium-driver) opens
  ``/ui#token=...``: the graph shows both vertices with the records they
  read, the checkpoint table and the plots show the job's checkpoints, the
  count grows between two reads and matches the REST API, the restart names
  the killed task's operator, the savepoint's folder is listed, and the page
  logs no error; screenshots of the jobs page and the job page are saved
  (into docs/img/ with ``LOCKGATE_UPDATE_SCREENSHOTS=1``);
* ``/metrics`` is scraped with the token and parsed by prometheus_client's
  parser: Flink's metric names, counts as counters (``_total``), one series
  per task, the checkpoint count as the REST API says; without the token it
  is refused, while the dashboard's static page is served (it holds no data);
* without the token in its URL, the page names ``lockgate dashboard JOB``;
* an autoscaled job's decisions are served by ``/jobs/<id>/autoscaler`` and
  shown on its page, a row per vertex rescaled (time, vertex, from, to,
  why, outcome), with each vertex's latest evaluation.

The Spark launcher's job and stage carry the job's name and a link to its
dashboard (run first, before the module's local job starts).

Under CI a missing chromium or chromium-driver is a failure, not a skip
(``.ci/run`` installs them with apt-get).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lockgate.api.client import JobClient
from lockgate.config import RestConfig
from tests.fault.sums_job import build

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
TOKEN = "dashboard-test-token-0123456789"
T = TypeVar("T")


def _wait(check: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.25)


def _need_chromium() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        message = (f"{', '.join(missing)} not installed: apt-get install -y chromium "
                   "chromium-driver (.ci/run does)")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[JobClient, str]]:
    tmp = tmp_path_factory.mktemp("dashboard")
    pipeline = build(None, 2, 3, str(tmp / "out"), str(tmp / "chk"), 0.4, rate=3000)
    client = pipeline.start(
        launcher="local", rest=RestConfig(token=TOKEN),
        # task 2 (sums -> out, subtask 0) dies once after its first acknowledgement
        fault_injection=[{"point": "acked", "task": 2, "attempt": 0, "count": 1}])
    try:
        dashboard = _wait(lambda: client.master.dashboard, 120, "the REST server")
        url = dashboard[0][:-len("/ui")]
        _wait(lambda: client.master.monitor.restart_count >= 1, 120, "the injected failure")
        _wait(lambda: client.master.coordinator.completed_count >= 2, 120, "two checkpoints")
        client.savepoint(str(tmp / "savepoints"), timeout=120)
        _wait(lambda: all(t["reported"] for v in client.master.metrics()["vertices"]
                          for t in v["tasks"]), 60, "every task's figures")
        yield client, url
    finally:
        client.cancel(timeout=120)


def _get(url: str, token: str | None = TOKEN) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_spark_job_and_stage_name_the_job_and_link_its_dashboard(tmp_path: Path) -> None:
    from pyspark import SparkContext

    pipeline = build(None, 1, 3, str(tmp_path / "out"), str(tmp_path / "chk"), 0.3, rate=2000)
    client = pipeline.start(launcher="spark")
    try:
        _wait(lambda: client.master.coordinator.completed_count >= 1, 240, "a checkpoint")
        dashboard = client.master.dashboard
        assert dashboard is not None
        sc = SparkContext._active_spark_context
        assert sc is not None
        assert sc.appName.startswith("Lockgate: ") or sc.appName == "lockgate"
        store = sc._jsc.sc().statusStore()  # what the Spark UI shows

        def described(items: Any) -> list[str]:
            found, it = [], items.iterator()
            while it.hasNext():
                text = it.next().description()
                if text.isDefined() and client.job_id in text.get():
                    found.append(text.get())
            return found

        jobs = described(store.jobsList(None))
        assert jobs == [f"Lockgate job sums ({client.job_id}) attempt 0 · dashboard: "
                        f'<a href="{dashboard[0]}">{dashboard[0]}</a>'], jobs
        assert TOKEN not in jobs[0] and dashboard[1] not in jobs[0]
    finally:
        client.cancel(timeout=120)


def test_metrics_scraped_and_parsed_as_prometheus_text(job: tuple[JobClient, str]) -> None:
    client, url = job
    assert _get(f"{url}/metrics", token=None)[0] == 401
    assert _get(f"{url}/metrics", token="wrong-token-wrong-token")[0] == 401
    status, text = _get(f"{url}/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # counts that only grow are counters with the _total suffix, the rest gauges
    for name in ("job_numRecordsIn", "job_numRecordsOut", "job_numRestarts",
                 "job_numberOfCompletedCheckpoints", "job_numberOfFailedCheckpoints",
                 "task_numRecordsIn", "task_numRecordsOut"):
        assert families[f"lockgate_{name}"].type == "counter", name
        assert f"# TYPE lockgate_{name}_total counter" in text, name
        assert {s.name for s in families[f"lockgate_{name}"].samples} == {
            f"lockgate_{name}_total"}, name
    assert families["lockgate_job_uptime"].type == "gauge"
    assert families["lockgate_task_inPoolUsage"].type == "gauge"
    completed = families["lockgate_job_numberOfCompletedCheckpoints"].samples
    assert len(completed) == 1 and completed[0].labels["job_id"] == client.job_id
    counts = json.loads(_get(f"{url}/jobs/{client.job_id}/checkpoints")[1])["counts"]
    count = counts["completed"]
    assert completed[0].value >= 2 and abs(completed[0].value - count) <= 2
    assert families["lockgate_job_numRestarts"].samples[0].value >= 1
    assert families["lockgate_job_lastCheckpointSize"].samples[0].value > 0
    for name in ("numRecordsIn", "busyTimeMsPerSecond", "backPressuredTimeMsPerSecond",
                 "idleTimeMsPerSecond", "inPoolUsage"):
        samples = families[f"lockgate_task_{name}"].samples
        assert sorted((s.labels["vertex"], s.labels["subtask_index"]) for s in samples) == [
            ("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")], name
    records = {s.labels["vertex"]: s.value for s in families["lockgate_task_numRecordsIn"]
               .samples if s.labels["subtask_index"] == "0"}
    assert records["0"] > 0, records
    for s in families["lockgate_task_busyTimeMsPerSecond"].samples:
        assert 0 <= s.value <= 1000
    # `lockgate dashboard JOB` prints the page's whole URL (from the discovery file)
    cli = subprocess.run([sys.executable, "-m", "lockgate.cli", "dashboard", client.job_id],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert cli.stdout.strip() == f"{url}/ui#token={TOKEN}&job={client.job_id}", cli.stderr
    # a job without an autoscaler says so
    status, text = _get(f"{url}/jobs/{client.job_id}/autoscaler")
    assert status == 200 and json.loads(text) == {"enabled": False}
    assert "lockgate_job_numAutoscalerDecisions_total{" not in _get(f"{url}/metrics")[1]
    # the page is public (no data in it), the data is not
    assert _get(f"{url}/ui", token=None)[0] == 200
    assert _get(f"{url}/jobs/{client.job_id}/metrics", token=None)[0] == 401


PAGE_JS = """
const q = (s) => document.querySelector(s), qa = (s) => [...document.querySelectorAll(s)];
const text = (s) => (q(s) ? q(s).textContent : "");
const pts = (s) => (q(s) ? Number(q(s).getAttribute("data-points")) : 0);
const c = text("#checkpoint-count").replace(/,/g, "");
return {
  count: /^[0-9]+$/.test(c) ? Number(c) : null,
  vertices: qa("#graph-svg g.vertex").map((g) => ({id: g.getAttribute("data-vertex"),
    records: Number(g.getAttribute("data-records-in")), text: g.textContent})),
  graph: text("#graph-svg"),
  checkpoints: qa("#checkpoints tr.checkpoint").map((r) => r.getAttribute("data-id")),
  checkpoint_rows: qa("#checkpoints tr.checkpoint").slice(0, 5).map((r) => r.textContent),
  checkpoint_table: text("#checkpoints"),
  savepoints: text("#savepoints"), restarts: text("#restarts"),
  points: {end_to_end: pts('#checkpoints-svg path[data-series="end_to_end"]'),
           read: pts('#rate-svg path[data-series="read"]')},
  size_dots: qa("#size-svg circle.dot").length,
  tasks: qa("#tasks tr.task[data-task]").length,
};
"""


def _browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def _shoot(driver: Any, name: str, out: Path, least: int = 900) -> None:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(max(least, int(height) + 120), 4000))
    time.sleep(0.3)
    path = out / name
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    if os.environ.get("LOCKGATE_UPDATE_SCREENSHOTS") == "1":
        (REPO / "docs" / "img").mkdir(parents=True, exist_ok=True)
        shutil.copy(path, REPO / "docs" / "img" / name)


def test_the_dashboard_shows_the_live_job_in_a_browser(job: tuple[JobClient, str],
                                                       tmp_path: Path) -> None:
    _need_chromium()
    client, url = job
    driver = _browser()
    try:
        driver.get(f"{url}/ui#token={TOKEN}")
        link = _wait(lambda: driver.execute_script(
            "const a = document.querySelector('#jobs tbody a');"
            "return a ? [a.textContent, a.getAttribute('href')] : null"), 30, "the jobs page")
        assert link[0] == client.job_id
        _shoot(driver, "dashboard-jobs.png", tmp_path, least=260)
        driver.get(f"{url}/ui{link[1]}")  # the job's page, by its link

        def page() -> dict[str, Any]:
            """What the page shows, read at once (it is drawn anew every second)."""
            return dict(driver.execute_script(PAGE_JS))

        def count() -> int | None:
            return page()["count"]

        first = _wait(count, 60, "the checkpoint count")
        assert first >= 2
        later = _wait(lambda: (c := count()) is not None and c > first and c, 60,
                      "the checkpoint count to grow")
        rest = client.master.coordinator.completed_count
        assert first < later <= rest  # what the page shows is the job's own count

        # the graph: both vertices, the source's records, their partitioning
        shown = _wait(lambda: (p := page())["vertices"] and p["vertices"][0]["records"] > 0
                      and p, 30, "records in the graph")
        assert [v["id"] for v in shown["vertices"]] == ["0", "1"]
        assert "HASH" in shown["graph"]
        assert "numbers" in shown["vertices"][0]["text"]
        assert "out" in shown["vertices"][1]["text"]

        # the checkpoint table: the REST API's checkpoints, newest first
        history = {h["id"]: h for h in client.checkpoints()}
        ids = [int(i) for i in shown["checkpoints"]]
        assert ids == sorted(ids, reverse=True) and len(ids) >= 3
        assert set(ids) <= set(history) | {max(ids)}
        for i, text in zip(ids[:5], shown["checkpoint_rows"], strict=False):
            if "completed" in text:  # the page read it before the REST call: final by then
                assert history[i]["status"] == "completed", (i, text)
        # the savepoint and the restart
        assert "savepoint" in shown["checkpoint_table"]
        assert "savepoints/savepoint-" in shown["savepoints"], shown["savepoints"]
        assert "sums->out[0] (task 2)" in shown["restarts"], shown["restarts"]

        # the plots: one point per completed checkpoint, the rate over time
        assert shown["points"]["end_to_end"] >= 2
        _wait(lambda: page()["points"]["read"] >= 8, 60, "the rate plot")
        assert shown["size_dots"] >= 2
        # the tasks table: every task reports
        assert shown["tasks"] == 4
        _shoot(driver, "dashboard-job.png", tmp_path)
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors

        # without the token (a link from the Spark UI, a log file's URL) the
        # page names the command that prints its whole URL
        for shown_url, command in ((f"{url}/ui#job={client.job_id}",
                                    f"lockgate dashboard {client.job_id}"),
                                   (f"{url}/ui", "lockgate dashboard JOB")):
            driver.get("about:blank")
            driver.get(shown_url)
            message = _wait(lambda: driver.execute_script(
                "const p = document.querySelector('#no-token');"
                "return p ? p.textContent : null"), 30, "the page without a token")
            assert command in message and "lockgate list" in message, message
    finally:
        driver.quit()



def test_the_dashboard_shows_the_autoscalers_decisions(tmp_path: Path) -> None:
    """An autoscaled job whose vertices idle at parallelism 2: the
    autoscaler takes both down to 1 in one decision; ``GET
    /jobs/<id>/autoscaler`` and the job page show it, a row per vertex
    (time, vertex, from, to, why, outcome), with each vertex's evaluation."""
    _need_chromium()
    from lockgate import AutoscalerConfig, CheckpointConfig, Pipeline
    from lockgate.connectors import SequenceSource
    from tests.fault.sums_job import running_sums

    p = Pipeline("autoscaled", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.5, storage=str(tmp_path / "chk")),
                 autoscale=AutoscalerConfig(max=4, stabilization=1.0, window=2.0,
                                            cooldown=600.0))
    running_sums(p.source(SequenceSource(1, None, rate=200), uid="numbers"), 3,
                 str(tmp_path / "out"))
    client = p.start(launcher="local", rest=RestConfig(token=TOKEN))
    driver = None
    try:
        dashboard = _wait(lambda: client.master.dashboard, 120, "the REST server")
        url = dashboard[0][:-len("/ui")]

        def served() -> dict[str, Any] | None:
            status, text = _get(f"{url}/jobs/{client.job_id}/autoscaler")
            answer = json.loads(text) if status == 200 else None
            done = answer and [d for d in answer["decisions"] if d["status"] == "done"]
            return answer if done and len(done) == 2 else None

        answer = _wait(served, 120, "the autoscaler's decision, done")
        assert answer["enabled"] and answer["config"]["max"] == 4
        rows = [(d["vertex"], d["from"], d["to"]) for d in answer["decisions"]]
        assert rows == [("numbers -> pairs", 2, 1), ("sums -> out", 2, 1)], answer["decisions"]
        for d in answer["decisions"]:
            assert "below 0.50" in d["why"] and d["inputs"]["utilization"] < 0.5
            assert d["inputs"]["true_rate"] > d["inputs"]["input_rate"]
        assert client.status()["vertex_parallelism"] == {"numbers -> pairs": 1,
                                                         "sums -> out": 1}
        assert _get(f"{url}/jobs/{client.job_id}/autoscaler", token=None)[0] == 401

        driver = _browser()
        driver.get(f"{url}/ui#token={TOKEN}&job={client.job_id}")

        def table() -> dict[str, Any] | None:
            shown = dict(driver.execute_script("""
                const qa = (s) => [...document.querySelectorAll(s)];
                return {
                  decisions: qa("#autoscaler-decisions tr.decision").map((r) => ({
                    vertex: r.getAttribute("data-vertex"), from: r.getAttribute("data-from"),
                    to: r.getAttribute("data-to"), text: r.textContent})),
                  evaluations: qa("#autoscaler-vertices tr.evaluation").map(
                    (r) => r.getAttribute("data-vertex")),
                  state: (document.querySelector("#autoscaler-state") || {}).textContent,
                };"""))
            return shown if len(shown["decisions"]) == 2 and shown["evaluations"] else None

        shown = _wait(table, 60, "the autoscaler's table on the job page")
        # newest first: the two rows of the one decision, in either order
        assert sorted((d["vertex"], d["from"], d["to"]) for d in shown["decisions"]) == [
            ("numbers -> pairs", "2", "1"), ("sums -> out", "2", "1")]
        for d in shown["decisions"]:
            assert "below 0.50" in d["text"] and "done" in d["text"], d["text"]
        assert set(shown["evaluations"]) == {"numbers -> pairs", "sums -> out"}
        assert shown["state"]
        _shoot(driver, "dashboard-autoscaler.png", tmp_path)
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        if driver is not None:
            driver.quit()
        client.cancel(timeout=120)
