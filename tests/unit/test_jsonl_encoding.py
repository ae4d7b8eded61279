"""The JSONL fast path (one encoder call per batch) writes exactly what the
per-record path writes, whatever the batch's shape."""

from __future__ import annotations

import json
import random

from lockgate.connectors.formats import JsonlFormat


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 2 else 5)
    if kind == 0:
        return rng.randint(-10**6, 10**6)
    if kind == 1:
        return rng.random() * 1e6
    if kind == 2:
        return rng.choice([None, True, False])
    if kind == 3:
        return rng.choice(["", "a,b", "],[", "x\"y", "ü", "[", "{}"])
    if kind == 4:
        return rng.randint(-3, 3)
    if kind in (5, 6):
        row = [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
        return tuple(row) if kind == 5 else row
    if kind == 7:
        return {str(rng.randrange(5)): random_value(rng, depth + 1) for _ in range(2)}
    return [rng.randint(0, 9) for _ in range(rng.randrange(3))]


def test_fast_path_equals_per_record_encoding():
    rng = random.Random(3)
    fmt = JsonlFormat()
    shapes = [
        lambda: rng.randint(-5, 5),
        lambda: rng.choice([1.5, None, True, 7]),
        lambda: (rng.randint(0, 9), rng.randint(0, 10**9)),
        lambda: [rng.randint(0, 3) for _ in range(rng.randrange(3))],
        lambda: random_value(rng),
    ]
    for _ in range(500):
        make = rng.choice(shapes)
        batch = [make() for _ in range(rng.randrange(1, 30))]
        lines = fmt.encode_batch(batch).decode().split("\n")
        assert lines[-1] == ""
        assert [json.loads(line) for line in lines[:-1]] == [
            json.loads(json.dumps(r)) for r in batch
        ], batch


def test_integers_beyond_64_bits_fall_back():
    out = JsonlFormat().encode_batch([2**70, (1, 2**80)])
    assert out == f"{2**70}\n[1,{2**80}]\n".encode()
