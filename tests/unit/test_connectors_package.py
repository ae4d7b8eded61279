"""``lockgate.connectors`` imports a connector's module (and its libraries:
pyarrow, numpy, a client) on first use of its name, not with the package:
``import lockgate`` (the driver, the local launcher's fork server) pays for
no connector, and every name the package lists still imports from it."""

from __future__ import annotations

import lockgate.connectors
from tests.fixtures import modules_imported_by


def test_import_lockgate_imports_no_connector_library() -> None:
    assert modules_imported_by("import lockgate, lockgate.runtime.task", (
        "pyarrow", "numpy", "confluent_kafka", "lockgate.connectors.delta",
        "lockgate.connectors.kafka")) == []


def test_every_listed_name_imports_from_the_package() -> None:
    for name in lockgate.connectors.__all__:
        value = getattr(lockgate.connectors, name)
        assert value.__name__ == name
    assert set(lockgate.connectors.__all__) <= set(dir(lockgate.connectors))
    from lockgate.connectors import KafkaSource
    from lockgate.connectors.kafka import KafkaSource as Direct

    assert KafkaSource is Direct


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        lockgate.connectors.NoSuchSink  # noqa: B018
    except AttributeError as e:
        assert "NoSuchSink" in str(e)
    else:
        raise AssertionError("no AttributeError")
