"""Names read back from a checkpoint or savepoint are untrusted input.

A savepoint copied from elsewhere, or a shared bucket, may hold a crafted
``_metadata`` or state file: a state file named ``../../x``, a file sink's
pending part named ``/etc/passwd``, a file source's position in
``../secret.jsonl``. Every name that comes from a checkpoint passes one of
these checks before it is joined to the folder it must live in, so nothing
outside that folder is read, created, moved or deleted; a bad name fails the
restore with an error naming the field and the value.
"""

from __future__ import annotations

from typing import Any

from lockgate.errors import CheckpointCorruptError

__all__ = ["plain_name", "relative_path", "MAX_NAME"]

MAX_NAME = 255
"""The longest file name a checkpoint may name (most filesystems' limit)."""


def _refuse(what: str, value: Any, why: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"{what} is {value!r}, {why}: the checkpoint or savepoint is damaged or was crafted; "
        "it is not restored, and nothing outside its folders was touched")


def plain_name(value: Any, what: str) -> str:
    """``value`` if it is one plain file name (no folder, no ``..``, not
    absolute, printable, at most :data:`MAX_NAME` characters)."""
    if not isinstance(value, str) or not value:
        raise _refuse(what, value, "not a file name")
    if len(value) > MAX_NAME:
        raise _refuse(what, value[:40] + "...", f"longer than {MAX_NAME} characters")
    if "/" in value or "\\" in value or value in (".", ".."):
        raise _refuse(what, value, "not a plain name inside its folder")
    if not value.isprintable():
        raise _refuse(what, value, "a name with control characters")
    return value


def relative_path(value: Any, what: str) -> str:
    """``value`` if it is a ``/``-separated path of plain names below its
    folder (no ``..``, no empty part, not absolute)."""
    if not isinstance(value, str) or not value:
        raise _refuse(what, value, "not a path")
    for part in value.split("/"):  # an absolute path starts with an empty part
        if part in ("", ".", ".."):
            raise _refuse(what, value, "not a path inside its folder")
        plain_name(part, what)
    return value
