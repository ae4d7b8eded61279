"""Every runnable block of README.md, CONTRIBUTING.md and docs/ runs as the
page shows it (the markers: ``tests/docs/runnable.py``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.runnable import Block, blocks, console_commands, output_matches

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUNNABLE = [page for page in PAGES
            if page.exists() and any(b.action == "run" for b in blocks(page))]
TIMEOUT = 300


def _environment(home: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return dict(os.environ, PYTHONPATH=str(ROOT), LOCKGATE_HOME=str(home),
                PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
                COLUMNS="100", PYTHONUNBUFFERED="1")


def _run(command: str, folder: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    done = subprocess.run(["bash", "-c", command], cwd=folder, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT)
    return done.returncode, done.stdout.splitlines()


def _check_block(block: Block, folder: Path, env: dict[str, str]) -> None:
    if block.action == "file":
        target = folder / block.argument
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text, encoding="utf-8")
        return
    if block.language == "python":
        script = folder / f"_block_{block.line}.py"
        script.write_text(block.text, encoding="utf-8")
        commands = [(f"{sys.executable} {script.name}", [])]
    elif block.language == "console":
        commands = console_commands(block.text)
    else:
        commands = [(block.text, [])]
    for n, (command, expected) in enumerate(commands):
        code, output = _run(command, folder, env)
        want = block.expected_exit if n == len(commands) - 1 else 0
        shown = "\n".join(output[-60:])
        assert code == want, (f"{block.name}: `{command.strip()}` exited with {code}, "
                              f"the page expects {want}:\n{shown}")
        if block.checks_output and block.language == "console":
            assert output_matches(expected, output), (
                f"{block.name}: `{command}` printed\n{shown}\nthe page shows\n"
                + "\n".join(expected))


@pytest.mark.parametrize("page", RUNNABLE, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE])
def test_runnable_blocks(page: Path, tmp_path: Path) -> None:
    folder = tmp_path / "work"
    shutil.copytree(ROOT / "examples", folder / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = _environment(tmp_path / "home")
    for block in blocks(page):
        _check_block(block, folder, env)


def test_the_markers_find_blocks():
    """The README's first example is marked, so the harness cannot silently run nothing."""
    readme = blocks(ROOT / "README.md")
    assert any(b.action == "run" and b.language == "console" for b in readme)
    assert any(b.action == "file" and b.language == "python" for b in readme)
