"""Running count and sum per remainder mod 10, from Redis Streams into Redis
hashes: idempotent upserts, exactly once for these deterministic updates.

    python examples/redis_upsert.py [N]
    lockgate run examples/redis_upsert.py [N]

Needs ``pip install 'lockgate[redis]'`` and Redis (``REDIS_URL``, default
``redis://127.0.0.1:6379/0``). Keys start with ``REDIS_PREFIX`` (default
``lg:``). On first use it fills the streams ``lg:numbers:0`` and
``lg:numbers:1`` with the numbers 1..N (even ones in the first, odd ones in
the second). The job reads both up to their last entries at the start,
keeps ``(count, sum)`` per remainder and writes every update to the hash
``lg:sums:<remainder>`` (fields ``count`` and ``sum``) at each checkpoint.

Why exactly once: a remainder's numbers all come from one stream, in the
stream's order, so the value written for a remainder is a function of the
input up to that record; a replay after a failure writes the same values
again, and the hashes end as without the failure. Kill a task while it runs
(``pkill -9 -f lgtask``): ``HGETALL lg:sums:7`` still ends with
``count`` N/10 and the exact sum.
"""

import os
import sys

import redis

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import RedisStreamSource, RedisUpsertSink

URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
P = os.environ.get("REDIS_PREFIX", "lg:")
STREAMS = [f"{P}numbers:0", f"{P}numbers:1"]
n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000

client = redis.Redis.from_url(URL)
if not any(client.exists(s) for s in STREAMS):
    pipe = client.pipeline(transaction=False)
    for x in range(1, n + 1):
        pipe.xadd(STREAMS[x % 2], {"x": x})
        if x % 10_000 == 0:
            pipe.execute()
    pipe.execute()
client.close()

pipeline = Pipeline("redis-upsert", parallelism=2,
                    checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
(pipeline.source(RedisStreamSource(URL, STREAMS, bounded=True), uid="numbers")
   .map(lambda e: (int(e.fields["x"]) % 10, 1, int(e.fields["x"])), uid="triples")
   .key_by(lambda t: t[0])
   .reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2]), uid="sums")
   .sink(RedisUpsertSink(URL, kind="hash", prefix=f"{P}sums:", key=lambda t: t[0],
                         value=lambda t: {"count": t[1], "sum": t[2]}, exactly_once=True),
         uid="out"))

if __name__ == "__main__":
    result = pipeline.run()
    print(f"{result.records_in} entries read, {result.restarts} restarts, "
          f"guarantee {result.guarantee}")
