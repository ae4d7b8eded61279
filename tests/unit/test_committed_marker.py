"""A savepoint's ``_committed`` marker is read back as untrusted input: only
an integer checkpoint id counts, anything else is no marker."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockgate.checkpoint import storage


def test_the_marker_round_trips(tmp_path: Path) -> None:
    assert storage.committed_marker(tmp_path) is None
    storage.mark_committed(tmp_path, 7)
    assert storage.committed_marker(tmp_path) == 7


@pytest.mark.parametrize("raw", [b"", b"7", b"[7]", b'{"checkpoint_id": "7"}',
                                 b'{"checkpoint_id": true}', b"\xff\xfe", b"{" * 5000])
def test_a_crafted_marker_is_no_marker(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / storage.COMMITTED).write_bytes(raw)
    assert storage.committed_marker(tmp_path) is None
