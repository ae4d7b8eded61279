"""The sending side of a keyed edge, alone: a task's key selector, routing to
key groups and channels, and the split of each batch into per-channel buffers
(``OutputEdgeWriter.add`` on a hash edge), without pickling or sockets.

    python benchmarks/bench_route.py [--records 10000] [--channels 2 4 8 16]

Records are W3's ``(x % 1000, x)`` pairs keyed by their first field; prints
nanoseconds per record for each number of downstream channels (the best of 301
repeats: the least disturbed by other work on the machine).
"""

from __future__ import annotations

import argparse
import timeit

from lockgate.api.plan import Partitioning
from lockgate.graph.jobgraph import OutputEdge
from lockgate.runtime.output import OutputEdgeWriter


class RoutedOnly(OutputEdgeWriter):
    """An edge writer whose full buffers are dropped instead of sent."""

    def _send(self, i: int) -> None:
        self.buffers[i] = []


def ns_per_record(batch: list[tuple[int, int]], channels: int, rounds: int = 1) -> float:
    edge = OutputEdge(downstream=1, downstream_parallelism=channels,
                      partitioning=Partitioning.HASH, key_selector=lambda kv: kv[0],
                      downstream_uid="sums", upstream_uid="pairs")
    writer = RoutedOnly(edge, [None] * channels, 0, 128, batch_size=1 << 30)

    def run() -> None:
        for _ in range(rounds):
            writer.add(batch)
            writer.flush()

    run()  # the key cache warm, as in a running job
    best = min(timeit.repeat(run, number=1, repeat=301))
    return best / (rounds * len(batch)) * 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=10_000, help="records per batch")
    ap.add_argument("--channels", type=int, nargs="+", default=[2, 4, 8, 16])
    args = ap.parse_args()
    batch = [(x % 1000, x) for x in range(1, args.records + 1)]
    for channels in args.channels:
        print(f"hash edge, {channels:>2} channels: "
              f"{ns_per_record(batch, channels):6.1f} ns per record", flush=True)


if __name__ == "__main__":
    main()
