"""The Spark type of state values (pure, no Spark needed but for
:func:`spark_type`): :mod:`lockgate.spark`'s ``read_state`` infers its
columns' types with it.

A signature describes the Spark type a Python value can take::

    "null" | "boolean" | "long" | "double" | "string" | "binary" | "date" |
    "timestamp" | "json" | ("array", elem) | ("struct", ((name, sig), ...)) |
    ("map", key_sig, value_sig)

``"json"`` means: no Spark type fits; the whole column becomes JSON text
(:func:`to_json_text`).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Callable
from typing import Any

__all__ = [
    "Sig",
    "value_signature",
    "merge_signatures",
    "spark_type",
    "to_json_text",
    "converter",
]

Sig = Any
"""A signature (see the module docstring)."""

_SCALARS: dict[type, str] = {
    bool: "boolean", float: "double", str: "string", bytes: "binary",
    dt.datetime: "timestamp", dt.date: "date",
}


def value_signature(v: Any) -> Sig:
    """The signature of one value (pure)."""
    if v is None:
        return "null"
    t = type(v)
    if t is int:
        return "long" if -(1 << 63) <= v < (1 << 63) else "json"
    if t in _SCALARS:
        return _SCALARS[t]
    if t is list:
        elem: Sig = "null"
        for x in v:
            elem = merge_signatures(elem, value_signature(x))
        return ("array", elem)
    if t is dict:
        if all(type(k) is str for k in v):
            return ("struct", tuple(sorted((k, value_signature(x)) for k, x in v.items())))
        ks: Sig = "null"
        vs: Sig = "null"
        for k, x in v.items():
            ks = merge_signatures(ks, value_signature(k))
            vs = merge_signatures(vs, value_signature(x))
        return ("map", ks, vs)
    return "json"  # tuple, set, Decimal, time, timedelta, big int, ...


def _struct_as_map(sig: Sig) -> Sig:
    vs: Sig = "null"
    for _, s in sig[1]:
        vs = merge_signatures(vs, s)
    return ("map", "string", vs)


def merge_signatures(a: Sig, b: Sig) -> Sig:
    """The signature of a column holding values of signatures ``a`` and ``b`` (pure).

    Equal ones stay; null merges with anything; arrays merge elementwise;
    dicts with the same string keys stay a struct, with other keys become a
    map of string to the merged value; anything else is ``"json"``."""
    if a == b or b == "null":
        return a
    if a == "null":
        return b
    if a == "json" or b == "json":
        return "json"
    if isinstance(a, tuple) and isinstance(b, tuple):
        if a[0] == "array" and b[0] == "array":
            return ("array", merge_signatures(a[1], b[1]))
        if a[0] == "struct" and b[0] == "struct":
            if [n for n, _ in a[1]] == [n for n, _ in b[1]]:
                return ("struct", tuple((n, merge_signatures(s, t))
                                        for (n, s), (_, t) in zip(a[1], b[1], strict=True)))
            return merge_signatures(_struct_as_map(a), _struct_as_map(b))
        if {a[0], b[0]} == {"struct", "map"}:
            return merge_signatures(*(_struct_as_map(x) if x[0] == "struct" else x
                                      for x in (a, b)))
        if a[0] == "map" and b[0] == "map":
            return ("map", merge_signatures(a[1], b[1]), merge_signatures(a[2], b[2]))
    return "json"


def _has_json(sig: Sig) -> bool:
    if sig == "json":
        return True
    if isinstance(sig, tuple):
        if sig[0] == "struct":
            return any(_has_json(s) for _, s in sig[1])
        if sig[0] == "map" and sig[1] == "null":  # Spark map keys cannot be null
            return True
        return any(_has_json(s) for s in sig[1:])
    return False


def spark_type(sig: Sig) -> Any:
    """The ``pyspark.sql.types`` type of a column of signature ``sig``."""
    from pyspark.sql import types as T

    scalars = {"null": T.StringType(), "boolean": T.BooleanType(), "long": T.LongType(),
               "double": T.DoubleType(), "string": T.StringType(), "binary": T.BinaryType(),
               "date": T.DateType(), "timestamp": T.TimestampType(), "json": T.StringType()}
    if isinstance(sig, str):
        return scalars[sig]
    if sig[0] == "array":
        return T.ArrayType(spark_type(sig[1]), True)
    if sig[0] == "struct":
        return T.StructType([T.StructField(n, spark_type(s), True) for n, s in sig[1]])
    return T.MapType(spark_type(sig[1]), spark_type(sig[2]), True)


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, set | frozenset):
        items = [_jsonable(x) for x in v]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if isinstance(v, dict):
        if all(isinstance(k, str) for k in v):
            return {k: _jsonable(x) for k, x in v.items()}
        return [[_jsonable(k), _jsonable(x)] for k, x in v.items()]
    if isinstance(v, bytes):
        return base64.b64encode(v).decode("ascii")
    if isinstance(v, dt.datetime | dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    if isinstance(v, decimal.Decimal):
        return str(v)
    return repr(v)  # a pickled object (never loaded here): cannot happen without pickle


def to_json_text(v: Any) -> str | None:
    """The JSON text of a state value for the fallback column type (pure):
    tuples and sets become arrays (sets sorted), dicts with non-string keys
    ``[[key, value], ...]``, bytes base64 text, dates and times ISO text,
    timedeltas seconds, decimals text. ``None`` stays null."""
    if v is None:
        return None
    return json.dumps(_jsonable(v), ensure_ascii=False)


def converter(sig: Sig) -> Callable[[Any], Any]:
    """What turns a value of a column of signature ``sig`` into its Spark value:
    :func:`to_json_text` if the column is JSON text (or holds some), else the value as it is."""
    return to_json_text if _has_json(sig) else _identity


def _identity(v: Any) -> Any:
    return v
