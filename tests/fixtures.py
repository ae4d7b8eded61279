"""Fixtures and helpers shared by the test areas; ``tests/conftest.py``
registers this module as a plugin, so every test can ask for its fixtures."""

from __future__ import annotations

import pytest

LAUNCHERS = ("local", "spark")
"""The launchers every integration and fault test runs on: on ``spark`` the
tasks run in the Python workers of a Spark barrier stage."""


@pytest.fixture(params=LAUNCHERS, ids=LAUNCHERS)
def launcher(request: pytest.FixtureRequest) -> str:
    """A test that asks for ``launcher`` runs once on each launcher, with the
    ids ``[local]`` and ``[spark]``; a test meant for one launcher names it
    instead."""
    return str(request.param)
