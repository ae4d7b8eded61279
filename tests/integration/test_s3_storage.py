"""Checkpoint storage and the file sink on S3 (a moto server on loopback) and on
``file://`` URLs, with real SIGKILLs of task processes.

The credentials and the endpoint travel inside the URLs only: the AWS_*
variables are removed from the environment the tasks inherit.
"""

from __future__ import annotations

import json
import logging
import uuid

import pyarrow.parquet as pq
import pytest

from lockgate import CheckpointConfig, FixedDelayRestart, NoRestart, Pipeline, fs
from lockgate.checkpoint import storage
from lockgate.cli import main as cli_main
from lockgate.connectors import FileSink, FileSource
from lockgate.connectors.base import TaskInfo
from lockgate.errors import ConfigurationError, JobFailedError, OutputLostError
from tests.fault.sums_job import build
from tests.fixtures import check_exact_sums, committed_lines, hidden_files

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

KEY, SECRET = "lockgate-test", "lockgate-secret"


class S3:
    """A moto S3 server on 127.0.0.1 and a fresh bucket per test."""

    def __init__(self, host: str, port: int) -> None:
        self.endpoint = f"{host}:{port}"
        self.client = boto3.client("s3", endpoint_url=f"http://{self.endpoint}",
                                   aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                                   region_name="us-east-1")

    def bucket(self) -> str:
        name = f"lg-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return name

    def url(self, bucket: str, prefix: str) -> str:
        return (f"s3://{KEY}:{SECRET}@{bucket}/{prefix}?endpoint_override={self.endpoint}"
                "&scheme=http&region=us-east-1")

    def keys(self, bucket: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@pytest.fixture(scope="module")
def s3_server():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()  # port 0: the OS picks a free port
    try:
        yield S3(*server.get_host_and_port())
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return s3_server


def _check_job(result, out: str, n: int, keys: int = 2) -> None:
    check_exact_sums(out, n, keys)
    assert result.status == "finished"
    assert result.records_in == n and result.records_out == n


def test_sums_on_s3_exactly_once_under_kills(s3):
    """Checkpoints and the JSONL file sink on S3; one SIGKILL per attempt at
    another protocol point; the committed objects are exactly the expected sums."""
    bucket = s3.bucket()
    out, chk = s3.url(bucket, "out"), s3.url(bucket, "checkpoints")
    n = 30_000
    faults = [
        {"point": "snapshot", "task": 1, "attempt": 0, "count": 2},
        {"point": "acked", "task": 3, "attempt": 1, "count": 1},
        {"point": "commit", "task": 2, "attempt": 2, "count": 2},
        {"point": "final_snapshot", "task": 0, "attempt": 3, "count": 1},
    ]
    p = build(n, 2, 2, out, chk, interval=0.1, rate=20_000)
    result = p.run(launcher="local", fault_injection=faults, job_id="sums-s3")
    _check_job(result, out, n)
    assert result.restarts == len(faults), result.failures

    # Checkpoints: the newest `retained` completed ones, each with its _metadata.
    job_dir = fs.join(chk, "sums-s3")
    done = storage.completed_checkpoints(job_dir)
    assert 1 <= len(done) <= 3
    assert result.latest_checkpoint == storage.checkpoint_dir(job_dir, done[-1])
    meta = storage.read_metadata(result.latest_checkpoint)
    assert meta.checkpoint_id == done[-1] and meta.final
    storage.verify_files(result.latest_checkpoint, meta.state_files())
    keys = s3.keys(bucket)
    assert not [k for k in keys if "probe" in k or k.endswith(".tmp")], keys
    assert all(k.startswith(("out/part-", "checkpoints/sums-s3/")) for k in keys if
               not k.endswith("/")), keys
    assert SECRET not in " ".join(result.failures)


def test_restore_from_checkpoint_on_s3(s3, capsys):
    """A job dies (no restarts); a new job starts from its checkpoint on S3, at
    another parallelism, and the output is exact; `lockgate inspect` reads it."""
    bucket = s3.bucket()
    out, chk = s3.url(bucket, "out"), s3.url(bucket, "chk")
    n = 20_000
    first = build(n, 2, 2, out, chk, interval=0.1, rate=10_000)
    first.restart = NoRestart()
    with pytest.raises(JobFailedError):
        first.run(launcher="local", job_id="first",
                  fault_injection=[{"point": "snapshot", "task": 0, "attempt": 0, "count": 3}])
    latest = storage.latest_completed(fs.join(chk, "first"))
    assert latest is not None and latest.startswith("s3://")

    assert cli_main(["inspect", latest]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["checkpoint_id"] == int(fs.basename(latest)[4:])
    assert set(shown["operators"]) >= {"numbers", "sums", "out"}

    second = build(n, 3, 2, out, chk, interval=0.1)
    result = second.run(launcher="local", from_checkpoint=latest, job_id="second")
    _check_job(result, out, n)
    assert result.restarts == 0


def test_parquet_sink_and_file_source_on_s3(s3):
    """FileSource reads JSONL objects of an S3 folder (hidden ones skipped);
    the Parquet file sink commits on S3 across a kill."""
    bucket = s3.bucket()
    rows = [{"i": i, "word": f"w{i % 7}"} for i in range(3_000)]
    for part in range(3):
        body = "".join(json.dumps(r) + "\n" for r in rows[part::3])
        s3.client.put_object(Bucket=bucket, Key=f"in/part-{part}.jsonl", Body=body.encode())
    s3.client.put_object(Bucket=bucket, Key="in/.hidden.jsonl", Body=b'{"i": -1}\n')
    out = s3.url(bucket, "out")
    p = Pipeline("parquet-s3", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.1, storage=s3.url(bucket, "chk")),
                 restart=FixedDelayRestart(max_attempts=5, delay_s=0.0))
    (p.source(FileSource(s3.url(bucket, "in"), format="jsonl"), uid="lines")
       .map(lambda r: {"i": r["i"], "word": r["word"].upper()}, uid="upper")
       .sink(FileSink(out, format="parquet"), uid="pq"))
    result = p.run(launcher="local",
                   fault_injection=[{"point": "commit", "task": 1, "attempt": 0, "count": 1}])
    assert result.status == "finished" and result.restarts == 1
    assert hidden_files(out) == []
    filesystem, folder = fs.resolve(out)
    got = []
    for name in sorted(fs.listdir(out)):
        assert name.startswith("part-pq-") and name.endswith(".parquet")
        got += pq.read_table(f"{folder}/{name}", filesystem=filesystem).to_pylist()
    assert sorted(got, key=lambda r: r["i"]) == [
        {"i": r["i"], "word": r["word"].upper()} for r in rows]


def test_s3_commit_is_copy_then_delete_and_idempotent(s3):
    """No rename on S3: a part is uploaded straight under its hidden pending
    name at pre-commit; commit copies it to its final name, then deletes it; a
    commit that stopped between the two is finished by doing it again."""
    bucket = s3.bucket()
    out = s3.url(bucket, "out")
    objects = lambda: [k for k in s3.keys(bucket) if not k.endswith("/")]
    w = FileSink(out).create_writer(TaskInfo("job", "out", 0, 1, 128, 0))
    w.restore([])
    w.write_batch([1, 2])
    assert objects() == []  # an upload in progress is no object
    [h1] = w.snapshot_state(1)
    assert objects() == [f"out/{h1['pending']}"] and h1["pending"].startswith(".")
    # a commit stopped after its copy: pending and final both exist
    s3.client.copy_object(Bucket=bucket, Key=f"out/{h1['final']}",
                          CopySource={"Bucket": bucket, "Key": f"out/{h1['pending']}"})
    w.commit(w.decode_entry(h1))
    assert objects() == [f"out/{h1['final']}"]
    w.notify_checkpoint_complete(1)  # commits again: final there, pending gone: a no-op
    assert committed_lines(out) == [1, 2]
    # a crash after pre-commit: the next attempt commits the pending part
    w.write_batch([3])
    [h2] = w.snapshot_state(2)
    w2 = FileSink(out).create_writer(TaskInfo("job", "out", 0, 1, 128, 1))
    w2.restore([h1, h2])
    assert committed_lines(out) == [1, 2, 3] and hidden_files(out) == []
    s3.client.delete_object(Bucket=bucket, Key=f"out/{h2['final']}")
    with pytest.raises(OutputLostError, match=h2["final"]) as e:
        w2.commit(w2.decode_entry(h2))
    assert SECRET not in str(e.value)


def test_missing_bucket_is_a_configuration_error(s3):
    url = s3.url("no-such-bucket", "out")
    with pytest.raises(ConfigurationError, match="'no-such-bucket' does not exist") as e:
        FileSink(url).validate()
    assert SECRET not in str(e.value) and "no-such-bucket/out" in str(e.value)
    with pytest.raises(ConfigurationError, match="checkpoint storage .*create it"):
        storage.prepare_job_dir(s3.url("no-such-bucket", "chk"), "job")
    # The driver refuses to start the job: nothing runs, nothing restarts.
    bucket = s3.bucket()
    p = build(10, 1, 2, s3.url(bucket, "out"), s3.url("no-such-bucket", "chk"), interval=0.1)
    with pytest.raises(ConfigurationError, match="no-such-bucket"):
        p.run(launcher="local")


def test_sums_on_file_urls(tmp_path):
    """file:// URLs are the local filesystem (fast path), kills included."""
    out, chk = (tmp_path / "out").as_uri(), (tmp_path / "chk").as_uri()
    n = 20_000
    faults = [{"point": "commit", "task": 2, "attempt": 0, "count": 2}]
    result = build(n, 2, 2, out, chk, interval=0.1, rate=40_000).run(
        launcher="local", fault_injection=faults, job_id="sums-file")
    check_exact_sums(tmp_path / "out", n, 2)
    assert result.status == "finished" and result.restarts == 1
    assert result.latest_checkpoint.startswith("file://")
    done = storage.completed_checkpoints(tmp_path / "chk" / "sums-file")
    assert done and (tmp_path / "chk" / "sums-file" / f"chk-{done[-1]}" / "_metadata").is_file()
