"""Clicks enriched with each user's profile from an external service, called
asynchronously (Flink's async I/O): up to 32 requests in flight per task,
results in click order, a request that takes longer than 1 s answered with
a default profile instead.

    python examples/async_enrichment.py OUT_DIR [CLICKS]
    lockgate run examples/async_enrichment.py OUT_DIR [CLICKS]

The profile service is a TCP server this example starts itself (a thread
with an asyncio server: one JSON line per request, after 1 to 20 ms; users
whose id is a multiple of 97 take 5 s). ``ProfileLookup`` keeps a pool of
connections per task, opened in ``open`` and closed in ``close`` on the
operator's event loop. Requests in flight at a checkpoint are part of it:
after a failure they are asked again, and every click reaches OUT_DIR once.
"""

import asyncio
import json
import random
import sys
import threading

from lockgate import AsyncFunction, CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, SequenceSource

USERS = 500
TIERS = ("free", "pro", "team")


def profile(user: int) -> dict:
    """What the service knows of ``user``."""
    return {"user": user, "tier": TIERS[user % 3], "country": ("DE", "FR", "US", "JP")[user % 4]}


async def serve_profiles(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while line := await reader.readline():
            user = int(line)
            await asyncio.sleep(5 if user % 97 == 0 else random.uniform(0.001, 0.02))
            writer.write(json.dumps(profile(user)).encode() + b"\n")
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


def start_service() -> int:
    """Start the profile service in a thread; its port."""
    ready: list[int] = []
    started = threading.Event()

    def run() -> None:
        loop = asyncio.new_event_loop()
        server = loop.run_until_complete(asyncio.start_server(serve_profiles, "127.0.0.1", 0))
        ready.append(server.sockets[0].getsockname()[1])
        started.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True, name="profile-service").start()
    started.wait(30)
    return ready[0]


class ProfileLookup(AsyncFunction):
    """A pool of connections to the service; one request at a time on each."""

    def __init__(self, port: int, connections: int = 32) -> None:
        self.port, self.size = port, connections

    async def open(self, ctx):
        self.pool: asyncio.Queue = asyncio.Queue()
        for _ in range(self.size):
            self.pool.put_nowait(await asyncio.open_connection("127.0.0.1", self.port))

    async def invoke(self, click):
        reader, writer = conn = await self.pool.get()
        try:
            writer.write(f"{click['user']}\n".encode())
            await writer.drain()
            answer = json.loads(await reader.readline())
        except BaseException:
            writer.close()  # a cancelled (timed out) request leaves its answer unread
            conn = await asyncio.open_connection("127.0.0.1", self.port)
            raise
        finally:
            self.pool.put_nowait(conn)
        return {**click, **answer}

    def timeout(self, click):
        return {**click, "tier": "unknown", "country": None}

    async def close(self):
        while not self.pool.empty():
            _, writer = self.pool.get_nowait()
            writer.close()


out_dir = sys.argv[1] if len(sys.argv) > 1 else "enriched/"
clicks = int(sys.argv[2]) if len(sys.argv) > 2 else 5_000

pipeline = Pipeline("async-enrichment", parallelism=2,
                    checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
(pipeline.source(SequenceSource(1, clicks), uid="clicks")
   .map(lambda i: {"click": i, "user": i * 7 % USERS}, uid="click")
   .async_map(ProfileLookup(start_service()), capacity=32, ordered=True, timeout=1.0,
              uid="profiles")
   .sink(FileSink(out_dir, format="jsonl"), uid="out"))

if __name__ == "__main__":
    result = pipeline.run()
    print(f"{clicks} clicks enriched; guarantee {result.guarantee}")
