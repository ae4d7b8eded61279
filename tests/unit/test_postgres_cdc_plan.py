"""The protocol decisions of the PostgreSQL CDC source (pure functions) and
the pgoutput decoder, on hand-made messages."""

from __future__ import annotations

import struct

import pytest

from lockgate.connectors.pgoutput import (
    Change,
    Transaction,
    decode_message,
    decode_transactions,
    format_lsn,
    parse_lsn,
)
from lockgate.connectors.postgres_cdc_plan import (
    Snapshot,
    after_position,
    check_position,
    chunk_high,
    emit_change,
    merge_chunk,
    skip,
    slot_target,
)
from lockgate.errors import CheckpointCorruptError, LockgateError


def txn(xid: int, final: int, *changes: Change, end: int | None = None) -> Transaction:
    return Transaction(xid, final, 0, end or final + 8, list(changes))


def ins(i: int, v: int = 0) -> Change:
    return Change("insert", "public.t", None, {"id": i, "v": v}, ["id"])


def upd(i: int, v: int, old: int | None = None) -> Change:
    before = None if old is None else {"id": old}
    return Change("update", "public.t", before, {"id": i, "v": v}, ["id"])


def dele(i: int) -> Change:
    return Change("delete", "public.t", {"id": i}, None, ["id"])


def test_snapshot_visibility_widens_xids_with_the_epoch():
    snap = Snapshot.parse(f"{(1 << 32) + 100}:{(1 << 32) + 110}:{(1 << 32) + 105}")
    assert snap.sees(99) and snap.sees(104) and not snap.sees(105) and not snap.sees(110)
    wrapped = Snapshot.parse(f"{(1 << 32) + 5}:{(1 << 32) + 10}:")
    assert wrapped.full(0xFFFFFFF0) == 0xFFFFFFF0  # the epoch before
    assert wrapped.sees(0xFFFFFFF0)


def test_a_chunk_merges_only_unseen_transactions_before_its_high_watermark():
    rows = {(1,): {"id": 1, "v": 0}, (2,): {"id": 2, "v": 0}}
    snap = Snapshot(100, 103, frozenset({101}))
    txns = [txn(99, 500, upd(1, 5)),            # seen by the SELECT: already in rows
            txn(101, 600, upd(2, 1), ins(3)),   # unseen, before high: merged
            txn(103, 700, dele(1)),             # unseen, before high: merged
            txn(104, 900, upd(2, 2))]           # at/after high: the stream's
    out = merge_chunk(rows, txns, snap, 900, "public.t", ["id"], None, (3,))
    assert out == {(2,): {"id": 2, "v": 1}, (3,): {"id": 3, "v": 0}}
    # keys outside the chunk's range are left to the chunk that holds them
    assert merge_chunk({}, [txn(101, 600, ins(4))], snap, 900, "public.t", ["id"],
                       None, (3,)) == {}


def test_the_stream_emits_a_change_iff_it_commits_at_or_after_its_chunks_high_watermark():
    chunks = {"public.t": [[[10], 500], [None, 800]]}
    assert chunk_high(chunks["public.t"], (10,)) == 500
    assert chunk_high(chunks["public.t"], (11,)) == 800
    assert emit_change(ins(5), 499, chunks) == []
    assert emit_change(ins(5), 500, chunks) == [("insert", None, {"id": 5, "v": 0})]
    assert emit_change(ins(50), 700, chunks) == []
    # a key moved from a chunk done earlier to one done later: the delete half only
    assert emit_change(upd(50, 1, old=5), 600, chunks) == [("delete", {"id": 5}, None)]
    assert emit_change(Change("insert", "public.other", None, {"id": 1}, ["id"]), 900,
                       chunks) == []


def test_positions_skip_what_was_read_and_say_where_the_slot_may_go():
    t = txn(7, 1000, ins(1), ins(2), ins(3), end=1040)
    assert skip([900, 0, 950], t) == 0
    assert skip([1000, 2, 0], t) == 2
    assert skip([1000, 3, 1040], t) == 3
    assert skip([1200, 0, 0], t) == 3
    assert after_position(t, 2) == [1000, 2, 0] and after_position(t, 3) == [1000, 3, 1040]
    assert slot_target([1000, 2, 0]) == 1000  # decoded again from its start
    assert slot_target([1000, 3, 1040]) == 1040
    for bad in (None, [1, 2], [1, -1, 0], ["1", 0, 0], [1, 2, 2**64]):
        with pytest.raises(CheckpointCorruptError):
            check_position(bad)


def _tuple(*values: str | None) -> bytes:
    out = struct.pack("!h", len(values))
    for v in values:
        out += b"n" if v is None else b"t" + struct.pack("!i", len(v.encode())) + v.encode()
    return out


def test_pgoutput_messages_decode_into_whole_transactions():
    relation = (b"R" + struct.pack("!I", 42) + b"public\0t\0" + struct.pack("!bh", 100, 3)
                + b"\x01id\0" + struct.pack("!Ii", 20, -1)
                + b"\x00name\0" + struct.pack("!Ii", 25, -1)
                + b"\x00ok\0" + struct.pack("!Ii", 16, -1))
    begin = b"B" + struct.pack("!qqI", 0x1_0000_0100, 1_000_000, 77)
    insert = b"I" + struct.pack("!I", 42) + b"N" + _tuple("1", "a", "t")
    update = b"U" + struct.pack("!I", 42) + b"K" + _tuple("1", None, None) + b"N" + _tuple(
        "2", None, "f")
    delete = b"D" + struct.pack("!I", 42) + b"K" + _tuple("2", None, None)
    commit = b"C" + struct.pack("!bqqq", 0, 0x1_0000_0100, 0x1_0000_0140, 1_000_000)
    relations: dict = {}
    [t] = decode_transactions([relation, begin, insert, update, delete, commit, begin],
                              relations)
    assert (t.xid, t.final_lsn, t.end_lsn, t.commit_ms) == (77, 0x1_0000_0100, 0x1_0000_0140,
                                                           946_684_801_000)
    assert [(c.op, c.before, c.after) for c in t.changes] == [
        ("insert", None, {"id": 1, "name": "a", "ok": True}),
        ("update", {"id": 1, "name": None, "ok": None}, {"id": 2, "name": None, "ok": False}),
        ("delete", {"id": 2, "name": None, "ok": None}, None)]
    # read already: left out without decoding its rows
    assert decode_transactions([begin, insert, commit], relations, (0x1_0000_0100, True)) == []
    assert format_lsn(0x1_0000_0100) == "1/100" and parse_lsn("1/100") == 0x1_0000_0100


def test_a_logical_decoding_message_decodes_alone():
    data = b"M" + struct.pack("!bq", 1, 0x100) + b"lockgate-cdc-done\0" + struct.pack(
        "!i", 2) + b"{}"
    assert decode_message(data) == ("lockgate-cdc-done", "{}")
    assert decode_message(b"B" + struct.pack("!qqI", 1, 2, 3)) is None


def test_pgoutput_values_of_each_kind_and_messages_cut_short():
    relation = (b"R" + struct.pack("!I", 7) + b"s\0t\0" + struct.pack("!bh", 100, 4)
                + b"\x01id\0" + struct.pack("!Ii", 23, -1)
                + b"\x00f\0" + struct.pack("!Ii", 701, -1)
                + b"\x00big\0" + struct.pack("!Ii", 1700, -1)
                + b"\x00doc\0" + struct.pack("!Ii", 3802, -1))
    begin = b"B" + struct.pack("!qqI", 0x200, 0, 5)
    commit = b"C" + struct.pack("!bqqq", 0, 0x200, 0x240, 0)
    toast = struct.pack("!h", 4) + b"t" + struct.pack("!i", 2) + b"-3" + b"t" + struct.pack(
        "!i", 8) + b"Infinity" + b"u" + b"t" + struct.pack("!i", 4) + "é{}".encode()
    insert = b"I" + struct.pack("!I", 7) + b"N" + toast
    extra = b"I" + struct.pack("!I", 7) + b"N" + _tuple("1", "0.5", "2.50", None, "x")
    relations: dict = {}
    [t] = decode_transactions([relation, begin, insert, extra, commit], relations)
    assert [c.after for c in t.changes] == [
        {"id": -3, "f": float("inf"), "doc": "é{}"},  # an unchanged TOASTed value: left out
        {"id": 1, "f": 0.5, "big": "2.50", "doc": None, "col4": "x"}]
    assert t.changes[0].table == "s.t" and t.changes[0].key_columns == ["id"]
    # a transaction not wanted is left out, its rows not decoded
    assert decode_transactions([begin, b"I" + struct.pack("!I", 7) + b"N\xff", commit],
                               relations, wanted=lambda xid, lsn: xid != 5) == []
    for cut in (insert[:-2], insert[:9], begin[:5], commit[:3], relation[:12], relation[:7]):
        with pytest.raises(LockgateError, match="cut short"):
            decode_transactions([relation, begin, cut, commit] if cut[:1] != b"R"
                                else [cut], {})
