"""Words counted from lines pushed over TCP: a source that cannot replay, so
the job is at-most-once and says so.

    python examples/socket_word_count.py
    lockgate run examples/socket_word_count.py --allow-non-replayable lines

Every task of a ``SocketSource`` connects to a TCP server and reads lines
until the server closes. This example starts that server itself (a thread
that sends a few sentences to each connection, then closes it); point
``SocketSource`` at your own instead, e.g. ``nc -lk 9999``. Lines read since
the last completed checkpoint are lost if a task fails (nothing can ask the
sender for them again): the job runs only because it names the source
(``allow_non_replayable=["lines"]``, ``--allow-non-replayable lines``), and
its result says ``at_most_once``. The running counts go to ``counts/``.
"""

import socket
import threading

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import CollectSink, SocketSource

TEXT = ["the lock holds the water", "until both levels are aligned",
        "then one batch goes through the lock"]


def serve(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.sendall("".join(line + "\n" for line in TEXT).encode())


listener = socket.create_server(("127.0.0.1", 0))
threading.Thread(target=serve, args=(listener,), daemon=True).start()

pipeline = Pipeline("socket-words", parallelism=1,
                    checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
(pipeline.source(SocketSource("127.0.0.1", listener.getsockname()[1]), uid="lines")
   .flat_map(lambda line: [(w, 1) for w in line.split()], uid="words")
   .key_by(lambda wc: wc[0])
   .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="counts")
   .sink(CollectSink("counts/"), uid="out"))

if __name__ == "__main__":
    result = pipeline.run(allow_non_replayable=["lines"])
    counts = dict(sorted(CollectSink("counts/").results(), key=lambda wc: wc[1]))
    print(f"guarantee {result.guarantee}; 'lock' counted {counts.get('lock')} times")
