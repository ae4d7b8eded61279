"""Small state kept inline in ``_metadata`` (``CheckpointConfig.inline_threshold``):
written only past the threshold, read back checked, never trusted."""

from __future__ import annotations

import base64
import zlib
from pathlib import Path

import pytest

from lockgate import CheckpointConfig
from lockgate.checkpoint import storage
from lockgate.checkpoint.metadata import MAX_INLINE, StateHandle
from lockgate.errors import CheckpointCorruptError


def _write(chk: Path, data: bytes, limit: int) -> tuple[int, int, bytes | None]:
    def write(out: storage.ChecksumWriter) -> None:
        for i in range(0, len(data), 7):  # in pieces, as write_keyed writes
            out.write(data[i:i + 7])
    return storage.write_state(str(chk), "op-0.state", write, limit)


@pytest.mark.parametrize("length", [0, 1, 99, 100])
def test_state_within_the_threshold_is_no_file(tmp_path, length):
    data = bytes(range(256))[:length]
    size, crc, inline = _write(tmp_path, data, 100)
    assert (size, crc, inline) == (length, zlib.crc32(data), data)
    assert not (tmp_path / "op-0.state").exists()


def test_state_past_the_threshold_is_a_file_with_every_byte(tmp_path):
    data = bytes(range(256)) * 3
    size, crc, inline = _write(tmp_path, data, 100)
    assert inline is None and (size, crc) == (len(data), zlib.crc32(data))
    assert (tmp_path / "op-0.state").read_bytes() == data
    assert storage.write_state_file(str(tmp_path), "b.state", lambda o: o.write(b"x")) == (
        1, zlib.crc32(b"x"))  # no threshold: always a file
    assert (tmp_path / "b.state").read_bytes() == b"x"


def test_inline_handles_go_through_metadata_and_are_read_back(tmp_path):
    data = b"\x00state\xff" * 10
    h = StateHandle("op-0.state", len(data), zlib.crc32(data), op_state=(0, len(data)),
                    inline=data)
    back = StateHandle.from_json(h.to_json(), "handle")
    assert back == h
    assert storage.read_state_file(str(tmp_path), back) == data
    storage.verify_files(str(tmp_path), [("op", back)])  # no file to find
    assert StateHandle.from_json(StateHandle("f", 1, 2).to_json(), "h").inline is None


@pytest.mark.parametrize("inline,problem", [
    (12, "not base64 text"),
    ("A" * ((MAX_INLINE + 2) // 3 * 4 + 4), "not base64 text"),
    ("not base64!", "not valid base64"),
    (base64.b64encode(b"other").decode(), "the checkpoint recorded"),
    (base64.b64encode(b"stats").decode(), "the checkpoint recorded"),  # same size, other CRC
])
def test_crafted_inline_state_is_refused(inline, problem):
    data = b"state"
    entry = StateHandle("op-0.state", len(data), zlib.crc32(data)).to_json()
    entry["inline"] = inline
    with pytest.raises(CheckpointCorruptError, match=problem):
        StateHandle.from_json(entry, "handle")


def test_a_savepoint_keeps_inline_state_in_its_metadata(tmp_path):
    from lockgate.checkpoint.kinds import CheckpointKind, OperatorStateMode
    from lockgate.checkpoint.metadata import CheckpointMetadata, OperatorMetadata

    chk = tmp_path / "job" / "chk-3"
    chk.mkdir(parents=True)
    small = b"small"
    size, crc = storage.write_state_file(str(chk), "op-1.state", lambda o: o.write(b"big" * 9))
    handles = [StateHandle("op-0.state", len(small), zlib.crc32(small), op_state=(0, 5),
                           inline=small),
               StateHandle("op-1.state", size, crc, op_state=(0, size))]
    meta = CheckpointMetadata(job_id="job", checkpoint_id=3, kind=CheckpointKind.SAVEPOINT,
                              timestamp=0.0, final=False, max_parallelism=128, operators={
        "op": OperatorMetadata(2, OperatorStateMode.SPLIT, handles)})
    target = Path(storage.write_savepoint(str(chk), str(tmp_path / "sp"), "job", 3, meta))
    assert sorted(p.name for p in target.iterdir()) == ["_metadata", "op-1.state"]
    back = storage.read_metadata(str(target))
    assert [storage.read_state_file(str(target), h) for _, h in back.state_files()] == [
        small, b"big" * 9]


def test_the_threshold_is_checked():
    assert CheckpointConfig().inline_threshold == 0
    with pytest.raises(ValueError, match="inline_threshold"):
        CheckpointConfig(inline_threshold=MAX_INLINE + 1)
    with pytest.raises(ValueError, match="inline_threshold"):
        CheckpointConfig(inline_threshold=-1)
