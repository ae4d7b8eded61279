"""Running sums from a NATS JetStream stream back into JetStream, exactly once.

    python examples/nats_sums.py [N]
    lockgate run examples/nats_sums.py [N]

Needs a NATS server with JetStream (``nats-server -js``; ``NATS_URL``,
default ``nats://127.0.0.1:4222``) and ``pip install 'lockgate[nats]'``.
Stream names start with ``NATS_PREFIX`` (default ``LG``), subjects with it
in lower case.
On first use it creates the stream ``LG_NUMBERS`` (subjects
``lg.numbers.0`` and ``lg.numbers.1``, the two splits the source reads in
parallel) holding the numbers 1..N, and ``LG_SUMS`` (subject ``lg.sums``,
duplicate window 2 minutes). The job reads ``LG_NUMBERS`` up to its last
message at the start, keeps a running sum per remainder mod 10 and
publishes every update, ``[remainder, sum]``, to ``lg.sums`` after the
checkpoint that covers it, with a ``Nats-Msg-Id`` JetStream uses to drop the
copies a recovery sends again. Kill a task while it runs (``pkill -9 -f
lgtask``): ``nats stream info LG_SUMS`` then still counts N messages more.
"""

import asyncio
import os
import sys

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import JetStreamSink, JetStreamSource

URL = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")
P = os.environ.get("NATS_PREFIX", "LG")  # of the streams' names; subjects in lower case
NUMBERS, SUMS, p = f"{P}_NUMBERS", f"{P}_SUMS", P.lower()
n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000


async def create_streams() -> None:
    """The two streams, and the input if its stream is new."""
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(URL)
    js = nc.jetstream()
    try:
        await js.stream_info(SUMS)
    except NotFoundError:
        await js.add_stream(name=SUMS, subjects=[f"{p}.sums"], duplicate_window=120)
    try:
        await js.stream_info(NUMBERS)
    except NotFoundError:
        await js.add_stream(name=NUMBERS, subjects=[f"{p}.numbers.*"])
        for lo in range(1, n + 1, 1000):
            await asyncio.gather(*(js.publish(f"{p}.numbers.{x % 2}", str(x).encode())
                                   for x in range(lo, min(lo + 1000, n + 1))))
    await nc.close()


asyncio.run(create_streams())

pipeline = Pipeline("nats-sums", parallelism=2,
                    checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
(pipeline.source(JetStreamSource(NUMBERS, subjects=[f"{p}.numbers.0", f"{p}.numbers.1"],
                                 url=URL, bounded=True, deserializer=int), uid="numbers")
   .map(lambda x: (x % 10, x), uid="pairs")
   .key_by(lambda kv: kv[0])
   .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
   .sink(JetStreamSink(f"{p}.sums", url=URL), uid="out"))

if __name__ == "__main__":
    result = pipeline.run()
    print(f"{result.records_out} running sums published to {p}.sums, "
          f"{len(result.completed_checkpoints)} checkpoints, {result.restarts} restarts, "
          f"guarantee {result.guarantee}")
