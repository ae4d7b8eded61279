"""``examples/async_enrichment.py`` runs as documented: every click once, with
its user's profile, or the default profile where the service took too long."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures import committed_lines
from tests.integration.test_examples import run_example


# (the Spark launcher runs async_map in tests/fault/test_async_io.py)
@pytest.mark.parametrize("way", ["lockgate run"])
def test_async_enrichment(tmp_path: Path, way):
    n = 1_200  # 12 clicks of slow users: each holds its task's ordered results 1 s
    run_example(way, "async_enrichment.py", [str(tmp_path / "out"), str(n)], tmp_path)
    rows = committed_lines(tmp_path / "out")
    assert sorted(r["click"] for r in rows) == list(range(1, n + 1))
    for r in rows:
        user = r["user"]
        assert user == r["click"] * 7 % 500
        if user % 97 == 0:  # the service takes 5 s: the timeout's default
            assert (r["tier"], r["country"]) == ("unknown", None)
        else:
            assert (r["tier"], r["country"]) == (("free", "pro", "team")[user % 3],
                                                 ("DE", "FR", "US", "JP")[user % 4])
