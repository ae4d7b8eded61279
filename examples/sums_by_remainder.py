"""Count and sum the numbers 1..N by their remainder mod 100, exactly once,
into JSONL files: one line per record, ``[remainder, count so far, sum so far]``.

    python examples/sums_by_remainder.py [N]
    lockgate run examples/sums_by_remainder.py [N]
    spark-submit --master 'local[4]' examples/sums_by_remainder.py [N]   # 4 task slots

With parallelism 2 the 100 remainders are shared by two tasks, and each
writes its own part files (``out/part-out-0-...``, ``out/part-out-1-...``
— the name says the task). The last line of remainder 7 for N = 1,000,000 is
``[7, 10000, 4999570000]``: 7 + 107 + ... + 999907. Kill any task process
while it runs (``pkill -9 -f lgtask``): the job restarts from its latest
checkpoint and the committed output is the same.
"""

import sys

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, SequenceSource

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000

pipeline = Pipeline("sums-by-remainder", parallelism=2,
                    checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
(pipeline.source(SequenceSource(1, n), uid="numbers")
   .map(lambda x: (x % 100, 1, x), uid="triples")                   # (remainder, count, sum)
   .key_by(lambda t: t[0])
   .reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2]), uid="sums")  # emits every update
   .sink(FileSink("out/", format="jsonl"), uid="out"))

if __name__ == "__main__":
    result = pipeline.run()
    print(f"{result.records_out} running sums committed, {len(result.completed_checkpoints)} "
          f"checkpoints, {result.restarts} restarts, guarantee {result.guarantee}")
