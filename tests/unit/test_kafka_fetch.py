"""A consumer's messages as records, in bulk (``connectors/kafka/fetch.py``)
and the reader's buffers of them: records and offsets per partition, in
order, cut at a bounded read's end offsets, taken in batches of at most the
size asked for."""

from __future__ import annotations

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

from lockgate.connectors.base import TaskInfo  # noqa: E402
from lockgate.connectors.kafka import KafkaRecord, KafkaSource  # noqa: E402
from lockgate.connectors.kafka.fetch import Chunk, chunks  # noqa: E402
from lockgate.errors import ConfigurationError  # noqa: E402

Message = confluent_kafka.Message


def msg(topic: str, partition: int, offset: int, value: bytes | None, key: bytes | None = None,
        headers: list | None = None, ts: int = 1000) -> object:
    return Message(topic=topic, partition=partition, offset=offset, key=key, value=value,
                   headers=headers, error=None, timestamp=(1, ts))


def test_records_are_kafka_records_in_runs_of_one_partition():
    messages = [msg("t", 0, 5, b"a", b"k", ts=7), msg("t", 0, 6, b"b"),
                msg("t", 1, 0, b"c", headers=[("h", b"v")]), msg("t", 0, 9, None)]
    runs = chunks(Message, messages, ["t"], None, "KafkaSource(t)")
    assert [split for split, _ in runs] == [("t", 0), ("t", 1), ("t", 0)]
    assert runs[0][1] == Chunk([KafkaRecord("t", 0, 5, 7, b"k", b"a"),
                                KafkaRecord("t", 0, 6, 1000, None, b"b")], [5, 6])
    assert runs[1][1].records == [KafkaRecord("t", 1, 0, 1000, None, b"c", (("h", b"v"),))]
    assert runs[2][1] == Chunk([KafkaRecord("t", 0, 9, 1000, None, None)], [9])
    assert type(runs[0][1].records[0]) is KafkaRecord


def test_several_topics_are_told_apart():
    messages = [msg("a", 0, 0, b"1"), msg("b", 0, 0, b"2"), msg("b", 0, 1, b"3")]
    runs = chunks(Message, messages, ["a", "b"], "int", "KafkaSource(a, b)")
    assert runs == [(("a", 0), Chunk([1], [0])), (("b", 0), Chunk([2, 3], [0, 1]))]


@pytest.mark.parametrize(("value_format", "values", "expected"), [
    ("bytes", [b"x", None], [b"x", None]),
    ("str", ["é".encode(), b"b"], ["é", "b"]),
    ("int", [b"12", b"-3"], [12, -3]),
    ("float", [b"1.5", b"2"], [1.5, 2.0]),
    ("json", [b'{"a": [1]}', b"null"], [{"a": [1]}, None]),
])
def test_a_value_format_makes_the_records_the_decoded_values(value_format, values, expected):
    messages = [msg("t", 3, i, v) for i, v in enumerate(values)]
    [(split, chunk)] = chunks(Message, messages, ["t"], value_format, "KafkaSource(t)")
    assert split == ("t", 3) and chunk == Chunk(expected, [0, 1])


def test_a_value_that_does_not_decode_is_named_with_the_fix():
    messages = [msg("t", 2, 40, b"1"), msg("t", 2, 41, b"x1")]
    with pytest.raises(ConfigurationError, match=r"offset 41 of partition 2 of topic 't' is "
                                                 r"not 'int' \(b'x1'.*value_format=None"):
        chunks(Message, messages, ["t"], "int", "KafkaSource(t)")
    with pytest.raises(ConfigurationError, match="offset 0 of partition 0 .* not 'str' \\(None"):
        chunks(Message, [msg("t", 0, 0, None)], ["t"], "str", "KafkaSource(t)")


def test_an_unknown_value_format_is_refused():
    with pytest.raises(ValueError, match="value_format must be None .* not 'xml'"):
        KafkaSource("127.0.0.1:9", "t", value_format="xml")


def reader(bounded_at: int | None = None):
    source = KafkaSource("127.0.0.1:9", "t", value_format="int")
    if bounded_at is not None:
        source.end_offsets = {("t", 0): bounded_at}
    r = source.create_reader(TaskInfo("j", "in", 0, 1, 8, 0))
    r.positions[("t", 0)] = 0
    r.last_record[("t", 0)] = 0.0
    return r


def test_batches_take_whole_chunks_then_parts_of_one():
    r = reader()
    r._buffer([(("t", 0), Chunk([1, 2, 3], [0, 1, 3])), (("t", 0), Chunk([4, 5], [4, 7]))])
    assert r._take(2) == [1, 2] and r.positions[("t", 0)] == 2
    assert r._take(3) == [3, 4, 5] and r.positions[("t", 0)] == 8
    assert r._take(3) == [] and r._buffered == 0


def test_a_bounded_read_keeps_no_record_at_or_beyond_its_end():
    r = reader(bounded_at=5)
    r._buffer([(("t", 0), Chunk([1, 2, 3], [2, 4, 5]))])
    r._buffer([(("t", 0), Chunk([9], [6]))])
    assert r._take(10) == [1, 2] and r.positions[("t", 0)] == 5
    assert ("t", 0) in r.ended
