"""Push sources that cannot replay (``SocketSource``, ``HttpPushSource``):
the job reports at-most-once, an exactly-once job refuses to start with one
unless it opts into the downgrade by name (or with ``True``), and records
pushed while the job runs come through."""

from __future__ import annotations

import json
import logging
import socket
import threading
import urllib.request

import pytest

from lockgate import CheckpointConfig, Pipeline
from lockgate.cluster.options import RunOptions
from lockgate.cluster.submission import prepare_job
from lockgate.connectors import FileSink, HttpPushSource, SequenceSource, SocketSource
from lockgate.errors import PipelineDefinitionError
from tests.fixtures import committed_lines


def pipeline(tmp_path, source, mode: str = "exactly_once", uid: str = "pushed") -> Pipeline:
    p = Pipeline("push", parallelism=1,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk"),
                                             mode=mode))
    p.source(source, uid=uid).sink(FileSink(str(tmp_path / "out"), format="jsonl"), uid="out")
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_exactly_once_refuses_a_push_source_unless_named(tmp_path, caplog):
    p = pipeline(tmp_path, SocketSource("127.0.0.1", 9))
    with pytest.raises(PipelineDefinitionError, match=r"allow_non_replayable=\['pushed'\]"):
        prepare_job(p, RunOptions(launcher="local"))
    with pytest.raises(PipelineDefinitionError, match="not sources of this job"):
        prepare_job(p, RunOptions(launcher="local", allow_non_replayable=["pushd"]))
    # two push sources: naming one is not enough
    two = pipeline(tmp_path, SocketSource("127.0.0.1", 9))
    two.source(HttpPushSource(1), uid="posted").sink(
        FileSink(str(tmp_path / "out2"), format="jsonl"), uid="out2")
    with pytest.raises(PipelineDefinitionError, match=r"\['posted'\]"):
        prepare_job(two, RunOptions(launcher="local", allow_non_replayable=["pushed"]))
    with caplog.at_level(logging.WARNING, logger="lockgate.driver"):
        for allowed in (["pushed"], True):
            master = prepare_job(p, RunOptions(launcher="local", allow_non_replayable=allowed))
            assert master.guarantee == "at_most_once"
        master = prepare_job(two, RunOptions(launcher="local",
                                             allow_non_replayable=["pushed", "posted"]))
        assert master.guarantee == "at_most_once"
    assert "AT-MOST-ONCE" in caplog.text and "LOST on a failure" in caplog.text
    # at-least-once asks for no opt-in, and is at-most-once with a push source
    loose = pipeline(tmp_path, SocketSource("127.0.0.1", 9), mode="at_least_once")
    assert prepare_job(loose, RunOptions(launcher="local")).guarantee == "at_most_once"
    # a replayable job is unaffected by a named opt-in of one of its sources
    replayable = pipeline(tmp_path, SequenceSource(1, 10), uid="numbers")
    master = prepare_job(replayable, RunOptions(launcher="local",
                                                allow_non_replayable=["numbers"]))
    assert master.guarantee == "exactly_once"


def test_socket_source_reads_lines_until_the_server_closes(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    lines = [json.dumps({"n": i}) for i in range(500)]

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            for i in range(0, len(lines), 50):  # in pieces, a line cut across sends
                conn.sendall(("\n".join(lines[i:i + 50]) + "\n").encode()[:-1])
                conn.sendall(b"\n")
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    p = pipeline(tmp_path, SocketSource("127.0.0.1", port))
    result = p.run(launcher="local", allow_non_replayable=["pushed"], rest=False)
    assert result.status == "finished" and result.guarantee == "at_most_once"
    assert committed_lines(tmp_path / "out") == lines


def test_http_push_source_takes_posted_records(tmp_path):
    port = free_port()
    p = pipeline(tmp_path, HttpPushSource(port))
    read = threading.Event()

    def on_progress(progress) -> None:
        if progress.records_read >= 300:
            read.set()

    client = p.start(launcher="local", allow_non_replayable=True, on_progress=on_progress,
                     rest=False)
    try:
        url = f"http://127.0.0.1:{port}/"
        for attempt in range(200):  # the task listens once it started
            try:
                body = "\n".join(json.dumps([i, "x"]) for i in range(200)).encode()
                urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=5)
                break
            except OSError:
                if attempt == 199:
                    raise
                threading.Event().wait(0.1)
        array = json.dumps([[i, "y"] for i in range(100)]).encode()
        as_json = {"Content-Type": "application/json"}
        assert urllib.request.urlopen(urllib.request.Request(url, data=array, headers=as_json),
                                      timeout=5).status == 200
        with pytest.raises(urllib.error.HTTPError, match="400"):
            urllib.request.urlopen(urllib.request.Request(url, data=b"{oops"), timeout=5)
        assert read.wait(60), "the posted records were not read"
    finally:
        result = client.stop(str(tmp_path / "sp"), drain=True)
    assert result.guarantee == "at_most_once"
    got = committed_lines(tmp_path / "out")
    assert sorted(got) == sorted([[i, "x"] for i in range(200)] + [[i, "y"] for i in range(100)])
