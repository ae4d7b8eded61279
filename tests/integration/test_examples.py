"""The examples in examples/ run as documented."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_odd_even_sums(tmp_path):
    out = subprocess.run([sys.executable, str(EXAMPLES / "odd_even_sums.py"), "20000"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "20000 sums committed" in out.stdout and "exactly_once" in out.stdout
    final = {}
    for f in sorted((tmp_path / "out").glob("part-*")):
        for line in f.read_text().splitlines():
            k, s = json.loads(line)
            final[k] = max(final.get(k, 0), s)
    assert final == {0: sum(range(2, 20001, 2)), 1: sum(range(1, 20001, 2))}


def test_word_count_state(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    texts = ["a b a", "c a", "b b"]
    (src / "lines.jsonl").write_text(
        "".join(json.dumps({"n": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    out = subprocess.run([sys.executable, str(EXAMPLES / "word_count_state.py"), str(src),
                          str(tmp_path / "out")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = pq.read_table(tmp_path / "out").to_pylist()
    best: dict[str, int] = {}
    for r in rows:
        best[r["word"]] = max(best.get(r["word"], 0), r["count"])
    assert best == {"a": 3, "b": 3, "c": 1, "<end>": 0}
    assert sum(1 for r in rows if r["word"] == "<end>") == 2  # finish() once per task
