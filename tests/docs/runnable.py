"""The runnable blocks of a Markdown page.

A fenced block is run by the docs tests when the line just before its fence
is one of these HTML comments (invisible on the rendered page):

- ``<!-- run -->``: a ``python`` block is written to a file and run with
  ``python``; a ``bash``/``console`` block runs its commands with bash (in a
  ``console`` block the lines starting with ``$ ``, the rest being their
  output). Every command must exit with 0.
- ``<!-- run: exit=N -->``: the same, the block's last command exits with N.
- ``<!-- run: output -->``: the same, and the output of a ``console`` block
  must match what the page shows: line by line, ``...`` in a line matches any
  text, and a line that is only ``...`` matches any number of lines.
- ``<!-- file: NAME -->``: the block is written to the file ``NAME`` (for
  the blocks after it), not run.

The blocks of one page run in order in one folder, which holds a copy of the
repository's ``examples/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_MARK = re.compile(r"^<!--\s*(run|file)\s*(?::\s*(.*?))?\s*-->\s*$")
_FENCE = re.compile(r"^(```+)\s*([\w+-]*)")


@dataclass(frozen=True, slots=True)
class Block:
    """One marked block of a page."""

    page: Path
    line: int  # the fence's line, 1-based
    language: str
    text: str
    action: str  # "run" or "file"
    argument: str  # the part after the colon, or ""

    @property
    def name(self) -> str:
        return f"{self.page.name}:{self.line}"

    @property
    def expected_exit(self) -> int:
        found = re.fullmatch(r"exit=(\d+)", self.argument)
        return int(found.group(1)) if found else 0

    @property
    def checks_output(self) -> bool:
        return self.argument == "output"


def blocks(page: Path) -> list[Block]:
    """The marked blocks of ``page``, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        mark = _MARK.match(lines[i])
        fence = _FENCE.match(lines[i + 1]) if mark and i + 1 < len(lines) else None
        if not (mark and fence):
            i += 1
            continue
        ticks, language = fence.group(1), fence.group(2) or "text"
        end = i + 2
        while end < len(lines) and not lines[end].startswith(ticks):
            end += 1
        text = "\n".join(lines[i + 2:end]) + "\n"
        found.append(Block(page, i + 2, language, text, mark.group(1), mark.group(2) or ""))
        i = end + 1
    return found


def console_commands(text: str) -> list[tuple[str, list[str]]]:
    """The commands of a ``console`` block, each with the output the page shows."""
    commands: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif commands:
            commands[-1][1].append(line)
    return commands


def output_matches(expected: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` lines match the ``expected`` ones (``...`` wildcards)."""
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    if head.strip() == "...":
        return any(output_matches(rest, actual[k:]) for k in range(len(actual) + 1))
    if not actual:
        return False
    pattern = ".*".join(re.escape(part) for part in head.rstrip().split("..."))
    first = re.fullmatch(pattern, actual[0].rstrip()) is not None
    return first and output_matches(rest, actual[1:])
