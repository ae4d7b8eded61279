"""Running sums of odd and even numbers, exactly once, into JSONL files.

    python examples/odd_even_sums.py [N]

Kill any task process while it runs (``pkill -9 -f task_main``): the job
restarts from its latest checkpoint and the committed output is the same.
"""

import sys

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, SequenceSource

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000

p = Pipeline("odd-even-sums", parallelism=2,
             checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
(p.source(SequenceSource(1, n), uid="numbers")
   .map(lambda x: (x % 2, x), uid="pairs")
   .key_by(lambda kv: kv[0])
   .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")   # emits every updated sum
   .sink(FileSink("out/", format="jsonl"), uid="out"))

if __name__ == "__main__":
    result = p.run()
    print(f"{result.records_out} sums committed, {len(result.completed_checkpoints)} "
          f"checkpoints, {result.restarts} restarts, guarantee {result.guarantee}")
