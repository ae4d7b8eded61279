"""The markers and the output matching of the docs harness."""

from __future__ import annotations

from pathlib import Path

from tests.docs.runnable import blocks, console_commands, output_matches


def test_marked_blocks_are_found_in_order(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- file: a.py -->\n```python\nprint(1)\n```\n\n```bash\nskip\n```\n"
                    "<!-- run: exit=2 -->\n```console\n$ python a.py\n1\n```\n")
    found = blocks(page)
    assert [(b.action, b.argument, b.language) for b in found] == [
        ("file", "a.py", "python"), ("run", "exit=2", "console")]
    assert found[0].text == "print(1)\n" and found[1].expected_exit == 2
    assert console_commands(found[1].text) == [("python a.py", ["1"])]


def test_output_wildcards() -> None:
    assert output_matches(["job ... starts", "...", "done"], ["job x-1 starts", "a", "b", "done"])
    assert output_matches(["..."], [])
    assert not output_matches(["job ... starts"], ["job x-1 started"])
    assert not output_matches(["a"], ["a", "b"])
