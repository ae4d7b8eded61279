"""Secrets in connector settings never reach a failure cause, the REST
API, the dashboard or the logs: a PostgreSQL DSN with a quoted password, URLs
with ``user:password@`` (PostgreSQL, Redis, NATS, ``s3://KEY:SECRET@``), and
Kafka's ``sasl.password`` and ``ssl.key.password``."""

from __future__ import annotations

import json
import logging
import time

import pytest

from lockgate import FixedDelayRestart, NoRestart, Pipeline
from lockgate.connectors import CollectSink, PostgresSink, SequenceSource
from lockgate.connectors.nats.client import redact_url as nats_redact
from lockgate.connectors.postgres_common import redact_dsn
from lockgate.connectors.redis_upsert import redact_url as redis_redact
from lockgate.errors import ConfigurationError, JobFailedError
from lockgate.fs import redact as fs_redact
from lockgate.redact import redact

SECRETS = ["top secret phrase", "hunter2", "p@ss:w/rd", "s3cr3t/KEY+x", "tok-123"]

CASES = [
    ("host=db user=u password='top secret phrase' dbname=x", "password=*** dbname=x"),
    ("host=db password=\"top secret phrase\" user=u", "password=*** user=u"),
    ("host=db password='it\\'s top secret phrase'", "password=***"),
    ("host=db password=hunter2", "password=***"),
    ("postgresql://u:hunter2@db:5432/x", "postgresql://u:***@db:5432/x"),
    ("postgresql://u@db/x?password=hunter2&sslmode=off", "password=***&sslmode=off"),
    ("redis://:hunter2@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
    ("nats://u:hunter2@127.0.0.1:4222", "nats://u:***@127.0.0.1:4222"),
    ("s3://AKIAX:s3cr3t/KEY+x@bucket/chk?region=x", "s3://AKIAX:***@bucket/chk?region=x"),
    ("{'bootstrap.servers': 'k:9092', 'sasl.password': 'hunter2'}", "'sasl.password': '***'"),
    ('{"ssl.key.password": "hunter2"}', '"ssl.key.password": "***"'),
    ("sasl.password=hunter2 ssl.key.password=tok-123", "sasl.password=*** ssl.key.password=***"),
]


@pytest.mark.parametrize("text,shown", CASES)
def test_every_form_of_secret_is_masked(text, shown):
    assert shown in redact(text)
    assert not any(s in redact(text) for s in SECRETS), redact(text)


def test_each_connectors_own_redaction_masks_its_secrets():
    assert redact_dsn("password='top secret phrase' user=u") == "password=*** user=u"
    assert "hunter2" not in redis_redact("redis://u:hunter2@h:6379/0")
    assert "hunter2" not in nats_redact("nats://u:hunter2@h:4222")
    assert "s3cr3t" not in fs_redact("s3://AKIAX:s3cr3t@bucket/chk")


def test_ordinary_words_are_left_alone():
    text = "job secret mismatch: the token is wrong; password authentication failed"
    assert redact(text) == text


def test_a_postgres_dsn_with_a_quoted_password_stays_out_of_the_error(caplog):
    dsn = ("host=127.0.0.1 port=5432 dbname=test user=lockgate_nobody "
           "password='top secret phrase' connect_timeout=5")
    p = Pipeline("pg-secret", parallelism=1, restart=NoRestart())
    p.source(SequenceSource(1, 10), uid="n").map(lambda x: (x, x), uid="kv").sink(
        PostgresSink(dsn, "t", ["k", "s"]), uid="out")
    with caplog.at_level(logging.DEBUG), pytest.raises((ConfigurationError, JobFailedError)) as e:
        p.run(launcher="local")
    assert "password=***" in str(e.value), e.value
    assert "secret phrase" not in str(e.value) and "secret phrase" not in caplog.text


class Leaky:
    """A user function whose error quotes connector settings."""

    def __call__(self, x: int) -> int:
        if x == 5:
            raise ValueError("cannot reach postgresql://u:hunter2@db/x with "
                             "{'sasl.password': 'tok-123'} and password='top secret phrase'")
        return x


def test_a_task_failure_quoting_settings_is_masked_in_the_cause(caplog):
    p = Pipeline("leaky", parallelism=1, restart=NoRestart())
    p.source(SequenceSource(1, 10), uid="n").map(Leaky(), uid="leak").sink(
        CollectSink(), uid="out")
    with caplog.at_level(logging.DEBUG), pytest.raises(JobFailedError) as e:
        p.run(launcher="local")
    assert "postgresql://u:***@db/x" in str(e.value), e.value
    for s in SECRETS:
        assert s not in str(e.value) and s not in caplog.text


def test_the_rest_apis_exceptions_hold_no_secret():
    """The job restarts after each failure: its restarts, as the REST API's
    ``/jobs/<id>/exceptions`` and the dashboard show them, are masked."""
    p = Pipeline("leaky-rest", parallelism=1, restart=FixedDelayRestart(max_attempts=50,
                                                                         delay_s=0.2))
    p.source(SequenceSource(1, 10), uid="n").map(Leaky(), uid="leak").sink(
        CollectSink(), uid="out")
    client = p.start(launcher="local")
    try:
        deadline = time.monotonic() + 60
        while not (restarts := client.master.metrics()["restarts"]):
            assert time.monotonic() < deadline, "no restart within 60 s"
            time.sleep(0.1)
        shown = json.dumps(restarts) + json.dumps(client.status(), default=str)
        assert "postgresql://u:***@db/x" in shown, shown
        for s in SECRETS:
            assert s not in shown, shown
    finally:
        client.cancel()
