"""Recovery time: from a task's SIGKILL to every task of the next attempt running.

    python benchmarks/bench_recovery.py [--kills 5] [--parallelism 2] [--launcher local|spark|both]

Runs a rate-limited sums job whose tasks kill themselves (SIGKILL) once per
attempt, right after a checkpoint was acknowledged, and prints the time from
the failure's detection to records flowing again, per restart. Detection of
a SIGKILL is immediate: the kernel closes the dead task's sockets.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.connectors import FileSink, SequenceSource


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--launcher", default="both", choices=["local", "spark", "both"])
    args = ap.parse_args()
    for launcher in ["local", "spark"] if args.launcher == "both" else [args.launcher]:
        measure(launcher, args.kills, args.parallelism)


def measure(launcher: str, kills: int, parallelism: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-recovery-"))
    try:
        p = Pipeline("bench-recovery", parallelism=parallelism,
                     checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp / "chk")),
                     restart=FixedDelayRestart(max_attempts=kills + 1))
        (p.source(SequenceSource(1, 400_000, rate=200_000), uid="numbers")
           .key_by(lambda x: x % 100)
           .reduce(lambda a, b: a + b, uid="sums")
           .sink(FileSink(str(tmp / "out")), uid="out"))
        faults = [{"point": "acked", "task": a % (2 * parallelism), "attempt": a,
                   "count": 2} for a in range(kills)]
        if launcher == "spark":  # measured on a warm session: start it first
            warm = Pipeline("warm-up", parallelism=parallelism,
                            checkpoint=CheckpointConfig(storage=str(tmp / "warm")))
            warm.source(SequenceSource(1, 10), uid="n").rebalance().sink(
                FileSink(str(tmp / "warm-out")), uid="o")
            warm.run(launcher="spark")
        result = p.run(launcher=launcher, fault_injection=faults)
        times = result.recovery_times
        print(f"{launcher} p={parallelism}: {len(times)} recoveries, "
              f"median {statistics.median(times):.2f} s, max {max(times):.2f} s "
              f"(from a task's SIGKILL to every task of the next attempt running)", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
