"""The figures behind the dashboard and /metrics: the TaskMetrics message (its
validation, on the wire), JobMetrics' rates and aggregates, the Prometheus
exposition parsed by prometheus_client's parser, and the dashboard's files."""

from __future__ import annotations

import json
import re

import msgpack
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lockgate import Pipeline
from lockgate.api.result import Progress as JobProgress
from lockgate.checkpoint.metadata import Progress
from lockgate.cluster.coordinator import AttemptPlan, CheckpointCoordinator
from lockgate.cluster.metrics import JobMetrics, ProgressReports, size_hint
from lockgate.config import CheckpointConfig
from lockgate.connectors import SequenceSource
from lockgate.connectors.collect import CollectSink
from lockgate.graph.jobgraph import build_job_graph
from lockgate.protocol import ProtocolError, TaskMetrics, decode_control, encode_control
from lockgate.web import prometheus
from lockgate.web.ui_files import FILES, ui_file


def test_task_metrics_round_trip() -> None:
    m = TaskMetrics(10, 9, 0.5, 0.25, 3.0, 0.5, 1_700_000_000_000.0, 7)
    assert decode_control(encode_control(m)) == m
    none = TaskMetrics(0, 0, 0.0, 0.0, 0.0, 0.0, None, 0)
    assert decode_control(encode_control(none)) == none
    backlog = TaskMetrics(10, 9, 0.5, 0.25, 3.0, 0.5, None, 7, 1234)
    assert decode_control(encode_control(backlog)) == backlog


@pytest.mark.parametrize("fields, complaint", [
    ([-1, 0, 0.0, 0.0, 0.0, 0.0, None, 0, None], "records_in must be >= 0"),
    ([0, 0, -1.0, 0.0, 0.0, 0.0, None, 0, None], "busy must be seconds"),
    ([0, 0, 0.0, float("inf"), 0.0, 0.0, None, 0, None], "backpressured must be seconds"),
    ([0, 0, 0.0, 0.0, float("nan"), 0.0, None, 0, None], "idle must be seconds"),
    ([0, 0, 0.0, 0.0, 0.0, 1.5, None, 0, None], "queue_fill must be in"),
    ([0, 0, 0.0, 0.0, 0.0, 0.5, float("nan"), 0, None], "watermark is NaN"),
    ([0, 0, 0.0, 0.0, 0.0, 0.5, "x", 0, None], "field watermark has type str"),
    ([0, 0, 0.0, 0.0, 0.0, 0.5, None, 0], "8 fields, expected 9"),
    ([0, 0, 0.0, 0.0, 0.0, 0.5, None, 0, -1], "backlog must be >= 0"),
    ([0, 0, 0.0, 0.0, 0.0, 0.5, None, 0, True], "field backlog has type bool"),
])
def test_malformed_task_metrics_are_protocol_errors(fields: list[object], complaint: str) -> None:
    with pytest.raises(ProtocolError, match=complaint):
        decode_control(msgpack.packb(["metrics", *fields]))


def _graph() -> Pipeline:
    p = Pipeline("m", parallelism=2)
    (p.source(SequenceSource(1, 1000), uid="numbers")
     .key_by(lambda x: x % 3).reduce(lambda a, b: a + b, uid="sums")
     .sink(CollectSink("/tmp/unused"), uid="out"))
    return p


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _metrics(records: int, busy: float, bp: float, idle: float,
             watermark: float | None = None) -> TaskMetrics:
    return TaskMetrics(records, records, busy, bp, idle, 0.25, watermark, 3)


def test_rates_are_the_difference_of_two_reports_and_vertices_aggregate_their_tasks() -> None:
    graph = build_job_graph(_graph())
    clock = Clock()
    jm = JobMetrics(graph, clock)
    source, sums = jm.vertices
    assert source["source"] and source["outputs"] == [
        {"to": sums["id"], "partitioning": "hash", "tag": None}]
    assert [o["uid"] for o in sums["operators"]] == ["sums", "out"]
    jm.on_task_metrics(0, _metrics(1000, 0.1, 0.0, 0.9))
    jm.on_task_metrics(1, _metrics(500, 0.2, 0.0, 0.8, 1000.0))
    clock.now += 2.0
    jm.on_task_metrics(0, _metrics(5000, 1.1, 0.4, 1.4))  # 2 s: 0.5 busy/s, 0.2 bp/s
    jm.on_task_metrics(1, _metrics(1500, 0.4, 0.0, 2.6, 2000.0))
    jm.on_state_bytes(2, 123)
    snap = jm.snapshot()
    v0 = snap["vertices"][0]
    t0, t1 = v0["tasks"]
    assert t0["records_in_per_second"] == pytest.approx(2000.0)
    assert t0["busy_ms_per_second"] == pytest.approx(500.0)
    assert t0["backpressured_ms_per_second"] == pytest.approx(200.0)
    assert t0["idle_ms_per_second"] == pytest.approx(250.0)
    assert t0["watermark"] is None and t1["watermark"] == 2000.0
    assert v0["records_in"] == 6500 and v0["records_in_per_second"] == pytest.approx(2500.0)
    assert v0["busy_ms_per_second"] == pytest.approx((500.0 + 100.0) / 2)
    assert v0["watermark"] is None  # one task has none yet
    v1 = snap["vertices"][1]
    assert v1["state_bytes"] == 123 and not v1["tasks"][1]["reported"]
    jm.on_restart(0, "task x failed", 2, lambda t: f"sums->out[0] (task {t})")
    jm.on_restart(1, "3 checkpoints failed", None, lambda t: "?")
    snap = jm.snapshot()
    assert snap["restart_count"] == 2
    assert [(r["attempt"], r["operator"]) for r in snap["restarts"]] == [
        (0, "sums->out[0] (task 2)"), (1, None)]
    jm.start_attempt()  # a new attempt counts from zero
    assert not jm.snapshot()["vertices"][0]["tasks"][0]["reported"]
    json.dumps(snap)  # JSON-ready


def test_size_hint_is_known_only_when_every_source_knows() -> None:
    assert size_hint(build_job_graph(_graph())) == 1000
    p = Pipeline("u")
    p.source(SequenceSource(1, None), uid="n").sink(CollectSink("/tmp/unused"), uid="o")
    assert size_hint(build_job_graph(p)) is None


def _overview(jm: JobMetrics) -> dict[str, object]:
    last = {"id": 4, "end_to_end": 0.25, "bytes": 2048, "alignment": 0.01,
            "sync_duration": 0.002}
    return {"job": {"status": "running", "uptime": 12.5, "restarts": 1, "records_read": 77,
                    "records_written": 70},
            "vertices": jm.snapshot()["vertices"],
            "checkpoints": {"completed": 4, "failed": 1, "in_progress": 0, "last": last,
                            "last_age": 0.5},
            "autoscaler": {"enabled": True, "decision_count": 3},
            "local_recovery": {"local": 4, "storage": 1}}


def test_prometheus_exposition_parses_and_carries_flink_names() -> None:
    """Flink's names; counters typed ``counter`` with Prometheus' ``_total``."""
    clock = Clock()
    jm = JobMetrics(build_job_graph(_graph()), clock)
    jm.on_task_metrics(0, _metrics(10, 0.0, 0.0, 0.0))
    clock.now += 1
    jm.on_task_metrics(0, TaskMetrics(110, 110, 0.5, 0.25, 0.25, 0.25, 1_000.0, 3, 42))
    text = prometheus.render([("job-1", 'a "quoted"\nname', _overview(jm))])
    families = {f.name: f for f in text_string_to_metric_families(text)}
    job = {name: families[f"lockgate_job_{name}"].samples for name in (
        "numberOfCompletedCheckpoints", "numberOfFailedCheckpoints", "lastCheckpointDuration",
        "lastCheckpointSize", "numRestarts", "lastCheckpointAgeSeconds")}
    assert job["numberOfCompletedCheckpoints"][0].value == 4
    assert job["lastCheckpointDuration"][0].value == 250.0
    assert job["lastCheckpointSize"][0].value == 2048
    assert job["numRestarts"][0].labels["job_name"] == 'a "quoted"\nname'
    busy = families["lockgate_task_busyTimeMsPerSecond"].samples
    assert [(s.labels["task_name"], s.labels["subtask_index"], s.value) for s in busy] == [
        ("numbers", "0", 500.0)]
    assert families["lockgate_task_numRecordsIn"].samples[0].value == 110
    assert families["lockgate_task_currentInputWatermark"].samples[0].value == 1000.0
    # the source's backlog (Flink's pendingRecords), the autoscaler's decisions
    assert [s.value for s in families["lockgate_task_pendingRecords"].samples] == [42]
    assert families["lockgate_job_numAutoscalerDecisions"].samples[0].value == 3
    # local recovery: restores from local copies, and those that read the storage
    assert families["lockgate_job_numLocalRecoveryRestores"].samples[0].value == 4
    assert families["lockgate_job_numLocalRecoveryFallbacks"].samples[0].value == 1
    # counts that only grow are counters, exposed with the _total suffix
    # (the parser names the family without it)
    counters = {f"lockgate_job_{n}" for n in (
        "numRestarts", "numRecordsIn", "numRecordsOut", "numberOfCompletedCheckpoints",
        "numberOfFailedCheckpoints", "numAutoscalerDecisions", "numLocalRecoveryRestores",
        "numLocalRecoveryFallbacks")} | {"lockgate_task_numRecordsIn",
                                         "lockgate_task_numRecordsOut"}
    for f in families.values():
        assert f.documentation
        assert f.type == ("counter" if f.name in counters else "gauge"), f.name
        assert all(s.name == f.name + ("_total" if f.type == "counter" else "")
                   for s in f.samples), f.samples
    assert counters <= set(families)
    assert "# TYPE lockgate_job_numRecordsIn_total counter" in text
    assert "# TYPE lockgate_task_numRecordsOut_total counter" in text
    assert "# TYPE lockgate_job_uptime gauge" in text
    assert re.search(r"^lockgate_job_numRestarts_total\{.*\} 1$", text, re.M), text


def test_dashboard_files_are_packaged_and_load_nothing_from_elsewhere() -> None:
    for name in FILES:
        status, body, headers = ui_file(f"/ui/{name}")
        assert status == 200 and body.data  # type: ignore[union-attr]
        assert "default-src 'self'" in headers["Content-Security-Policy"]
        text = body.data.decode()  # type: ignore[union-attr]
        assert not re.search(r"(src|href)=\"https?:", text)
        assert "cdn" not in text.lower()
    assert ui_file("/ui")[1].data == ui_file("/ui/index.html")[1].data  # type: ignore[union-attr]
    assert ui_file("/ui/../server.py")[0] == 404
    assert ui_file("/ui/%2e%2e/server.py")[0] == 404


def test_spark_names_the_job_and_links_its_dashboard_without_the_token() -> None:
    from lockgate.cluster.spark.naming import app_name, dashboard_of, spark_description

    class Server:
        url = "http://127.0.0.1:4321"
        token = "secret-token-secret-token"

    assert app_name("sums") == "Lockgate: sums"
    assert spark_description("job-x", 0) == "Lockgate job job-x attempt 0"
    assert dashboard_of("job-1", "a <b> & c", Server()) == (
        "http://127.0.0.1:4321/ui", "secret-token-secret-token")
    text = spark_description("job-1", 2)
    assert text.startswith("Lockgate job a &lt;b&gt; &amp; c (job-1) attempt 2 · dashboard: ")
    assert '<a href="http://127.0.0.1:4321/ui">http://127.0.0.1:4321/ui</a>' in text
    assert "secret" not in text
    assert dashboard_of("job-2", "n", None) is None
    assert "dashboard" not in spark_description("job-2", 0)


def test_history_shows_the_in_flight_bytes_of_an_unaligned_checkpoint() -> None:
    from lockgate.checkpoint.history import CheckpointRecord, CheckpointStatus
    from lockgate.cluster.metrics import history_entry

    record = CheckpointRecord(7, "periodic", CheckpointStatus.COMPLETED, 1.0, duration=0.2,
                              size=5000, in_flight=1200)
    entry = history_entry(record)
    assert entry["in_flight"] == 1200 and entry["bytes"] == 5000
    assert json.loads(json.dumps(entry)) == entry  # the REST API's JSON


def test_progress_is_reported_once_per_completed_checkpoint(tmp_path) -> None:
    """ProgressReports alone, with a real coordinator and a fake clock: a
    report when a checkpoint completed since the last one, none in between."""
    now = [50.0]
    c = CheckpointCoordinator("job", tmp_path / "job", CheckpointConfig(interval=None,
                                                                         storage=str(tmp_path)),
                              {"src": 1}, {"src": "split"}, 128, lambda a, t, m: None,
                              lambda: now[0])
    c.start_attempt(AttemptPlan(0, [0], [0], {0: (0, 0, ["src"])}))
    reports: list[JobProgress] = []
    progress = ProgressReports("job", lambda: now[0])
    now[0] = 60.0
    progress.start()

    def totals() -> Progress:
        return Progress(12, 3)

    progress.update(c, totals, 0, reports.append)
    assert reports == []  # nothing completed yet
    c.on_ack(0, c.trigger(), {"src": None})
    now[0] = 62.5
    progress.update(c, totals, 1, reports.append)
    progress.update(c, totals, 1, reports.append)
    assert [(r.checkpoints_completed, r.last_checkpoint_id, r.records_read, r.restarts,
             r.elapsed) for r in reports] == [(1, 1, 12, 1, 2.5)]
    c.on_ack(0, c.trigger(), {"src": None})
    progress.update(c, totals, 1, None)  # no callback: counted all the same
    assert progress.reported == 2 and len(reports) == 1


def test_local_restores_are_recorded_and_counted_for_the_dashboard() -> None:
    p = Pipeline("g")
    p.source(SequenceSource(1, 10), uid="src").sink(CollectSink(), uid="out")
    m = JobMetrics(build_job_graph(p))
    m.on_local_restores(1, 0, [["agg", 4, True, ""], ["win", 4, False, "none on this host"]],
                        "src->out[0] (task 0)")
    assert [(r.attempt, r.operator, r.local, r.reason) for r in m.local_restores] == [
        (1, "agg", True, ""), (1, "win", False, "none on this host")]
