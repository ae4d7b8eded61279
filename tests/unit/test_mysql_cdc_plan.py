"""The pure decisions of the MySQL CDC source: positions, GTID states, the
forms of values, the chunk SELECT, TRUNCATE (also in the middle of a snapshot)."""

from __future__ import annotations

import datetime as dt

import pytest

from lockgate.connectors.cdc import Change, emit_change
from lockgate.connectors.mysql_cdc_plan import (
    check_position,
    chunk_select,
    column_kind,
    coordinate,
    key_type_ok,
    next_gtid_state,
    snapshot_values,
    stream_values,
    truncated_table,
)
from lockgate.errors import CheckpointCorruptError, LockgateError


def test_coordinates_follow_the_binlog_order():
    assert coordinate("mariadb-bin.000012", 4711) == (12 << 32) | 4711
    assert coordinate("b.000001", 2**32 - 1) < coordinate("b.000002", 4)
    for file, offset in (("no-number", 4), ("b.000001", -1), ("b.000001", 2**32)):
        with pytest.raises(ValueError):
            coordinate(file, offset)


def test_positions_read_back_are_checked():
    good = ["binlog.000003", 1234, 2, "0-1-57,1-2-9", "0-1-58"]
    assert check_position(good) == good
    assert check_position(["binlog.000003", 4, 0, "", ""])
    mysql = ["binlog.000003", 4, 0, "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-57:60", ""]
    assert check_position(mysql)
    for bad in (None, good[:4], [*good[:1], "1234", *good[2:]], ["../x.000001", *good[1:]],
                [*good[:3], "0-1-x", ""], [*good[:3], "0-1-1; DROP TABLE t", ""],
                [*good[:1], 2, *good[2:]], [*good[:2], -1, *good[3:]]):
        with pytest.raises(CheckpointCorruptError):
            check_position(bad)


def test_gtid_states_move_per_domain_and_per_source():
    assert next_gtid_state("", "0-1-5") == "0-1-5"
    assert next_gtid_state("0-1-5,2-3-7", "0-1-6") == "0-1-6,2-3-7"
    assert next_gtid_state("0-1-5", "1-9-1") == "0-1-5,1-9-1"
    uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
    assert next_gtid_state(f"{uuid}:1-57", f"{uuid}:58") == f"{uuid}:1-58"
    assert next_gtid_state("", f"{uuid}:1") == f"{uuid}:1"


def test_key_types_order_in_python_as_on_the_server():
    assert key_type_ok("bigint", None) and key_type_ok("datetime", None)
    assert key_type_ok("varchar", "utf8mb4_bin") and key_type_ok("char", "binary")
    assert not key_type_ok("varchar", "utf8mb4_general_ci")
    assert not key_type_ok("float", None) and not key_type_ok("timestamp", None)


def test_values_come_in_one_form_from_the_snapshot_and_the_stream():
    kinds = {"b": column_kind("bit", "bit(10)", None), "s": column_kind("set", "set('p')", 3),
             "n": column_kind("binary", "binary(4)", 4), "u": column_kind("uuid", "uuid", 16),
             "i": column_kind("inet6", "inet6", 16), "d": column_kind("datetime", "", None)}
    when = dt.datetime(2024, 1, 2, 3, 4, 5)
    snap = snapshot_values({"b": b"\x02\x01", "s": "p,r", "n": b"\x01\x00\x00\x00",
                            "u": "f81d4fae-7dec-11d0-a765-00a0c91e6b00", "i": "2001:db8::",
                            "d": when}, kinds)
    stream = stream_values({"b": "1000000001", "s": {"p", "r"}, "n": b"\x01",
                            "u": bytes.fromhex("f81d4fae7dec11d0a76500a0c91e6b"),
                            "i": bytes.fromhex("20010db8"), "d": when}, kinds)
    assert snap == stream == {"b": 513, "s": {"p", "r"}, "n": b"\x01\x00\x00\x00",
                              "u": "f81d4fae-7dec-11d0-a765-00a0c91e6b00", "i": "2001:db8::",
                              "d": when}
    assert snapshot_values({"s": "", "b": None}, kinds) == {"s": set(), "b": None}
    json_kind = {"j": column_kind("json", "json", None)}  # MySQL's; MariaDB's is text
    assert (snapshot_values({"j": '{"k": [1, "s", {"n": null}]}'}, json_kind)
            == stream_values({"j": {b"k": [1, b"s", {b"n": None}]}}, json_kind)
            == {"j": {"k": [1, "s", {"n": None}]}})


def test_the_chunk_select_spells_the_row_comparison_out():
    sql, params = chunk_select("db", "t", ["a", "b", "c"], ["a", "b"], [1, "x"], [5, "y"])
    assert sql == ("SELECT `a`, `b`, `c` FROM `db`.`t` WHERE ((`a` > %s) OR (`a` = %s AND "
                   "`b` > %s)) AND ((`a` < %s) OR (`a` = %s AND `b` <= %s)) ORDER BY `a`, `b`")
    assert params == [1, 1, "x", 5, 5, "y"]
    sql, params = chunk_select("db", "we`ird", ["id"], ["id"], None, [7])
    assert sql == "SELECT `id` FROM `db`.`we``ird` WHERE ((`id` <= %s)) ORDER BY `id`"
    assert params == [7]
    assert chunk_select("db", "t", ["id"], ["id"], None, None)[0] == (
        "SELECT `id` FROM `db`.`t` ORDER BY `id`")


def test_truncate_statements_name_their_table():
    assert truncated_table("TRUNCATE TABLE `t`", "db") == "db.t"
    assert truncated_table("truncate other.t2", "db") == "other.t2"
    assert truncated_table("  TRUNCATE `o`.`t`", "db") == "o.t"
    assert truncated_table("ALTER TABLE t ADD c int", "db") is None


def test_a_truncate_in_the_middle_of_a_snapshot_fails():
    chunks = {"db.t": [[[10], 100], [None, 200]]}
    cut = Change("truncate", "db.t", None, None, ["id"])
    assert emit_change(cut, 50, chunks) == []
    assert emit_change(cut, 200, chunks) == [("truncate", None, None)]
    with pytest.raises(LockgateError, match="truncated while its snapshot"):
        emit_change(cut, 150, chunks)
