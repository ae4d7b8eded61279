"""What state TTL costs per state access, in one process (no job around it).

    python benchmarks/bench_ttl.py [--n 200000] [--keys 10000] [--backend heap|rocksdb|both]

A keyed running count: for ``n`` records over ``keys`` keys, ``value()``
then ``update(value + 1)`` of a value state, as a ``KeyedProcessFunction``
does — without TTL, with TTL and no incremental cleanup, and with TTL and
the incremental cleanup of size 1 and 5 (Flink's default). The TTL is an
hour: nothing expires, so every variant does the same work for the user and
the difference is what TTL costs. Reported in CPU time of this process
(records per CPU second), the best of three runs, so a loaded machine
disturbs the figures less than wall time would.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

from lockgate.state.backend import ValueStateDescriptor
from lockgate.state.backends import BackendScope, RocksDBStateBackend, close_backend
from lockgate.state.factory import create_keyed_backend
from lockgate.state.serde import StateSerializer
from lockgate.state.ttl import TtlStates
from lockgate.state.ttl_config import IncrementalCleanup, StateTtlConfig

HOUR = 3_600_000
VARIANTS: dict[str, StateTtlConfig | None] = {
    "no TTL": None,
    "TTL, no incremental cleanup": StateTtlConfig(HOUR, cleanup_incrementally=None),
    "TTL, incremental cleanup 1": StateTtlConfig(HOUR, cleanup_incrementally=IncrementalCleanup(1)),
    "TTL, incremental cleanup 5": StateTtlConfig(HOUR),
}


def run(backend_name: str, ttl: StateTtlConfig | None, n: int, keys: int, folder: str) -> float:
    """Records per CPU second."""
    config = None if backend_name == "heap" else RocksDBStateBackend(local_dir=folder)
    backend: Any = create_keyed_backend(config, 128, range(128), StateSerializer(),
                                        BackendScope("bench", "ttl", 0, 0, folder))
    try:
        state = TtlStates(backend).get_state(ValueStateDescriptor("count", default=0, ttl=ttl))
        start = time.process_time()
        for i in range(n):
            backend.current_key = i % keys
            state.update(state.value() + 1)
        return n / (time.process_time() - start)
    finally:
        close_backend(backend)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--backend", default="both", choices=["heap", "rocksdb", "both"])
    args = ap.parse_args()
    backends = ["heap", "rocksdb"] if args.backend == "both" else [args.backend]
    print(f"{args.n} records over {args.keys} keys; records per CPU second (best of 3)")
    print("| backend | variant | records/s | vs no TTL |")
    print("| --- | --- | ---: | ---: |")
    with tempfile.TemporaryDirectory(prefix="lockgate-bench-ttl-") as folder:
        for name in backends:
            base = None
            for label, ttl in VARIANTS.items():
                rate = max(run(name, ttl, args.n, args.keys, folder) for _ in range(3))
                base = base or rate
                print(f"| {name} | {label} | {rate:,.0f} | {rate / base:.2f} |", flush=True)


if __name__ == "__main__":
    main()
