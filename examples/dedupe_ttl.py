"""State TTL: drop repeated events, remembering each event id for an hour.

Events are JSONL lines ``{"id": ..., "user": ..., "amount": ...}`` in a
folder. The first event of each id passes; a repeat within the hour is
dropped. Each id's state expires an hour after it was written, so the state
holds the ids of the last hour, not every id ever seen: expired ids are
removed as they are read, checked a few at a time on every access, and left
out of every checkpoint and savepoint (docs/state-ttl.md).

    python examples/dedupe_ttl.py IN_DIR OUT_DIR
    lockgate run examples/dedupe_ttl.py IN_DIR OUT_DIR
    spark-submit --master 'local[4]' examples/dedupe_ttl.py IN_DIR OUT_DIR
"""

import sys
from datetime import timedelta

from lockgate import (
    CheckpointConfig,
    KeyedProcessFunction,
    Pipeline,
    StateTtlConfig,
    ValueStateDescriptor,
)
from lockgate.connectors import FileSink, FileSource

SEEN = ValueStateDescriptor("seen", default=False,
                            ttl=StateTtlConfig(timedelta(hours=1)))


class FirstOfEachId(KeyedProcessFunction):
    def open(self, ctx):
        self.seen = ctx.get_state(SEEN)

    def process_element(self, event, ctx):
        if not self.seen.value():  # False for a new id, and once its hour is over
            self.seen.update(True)
            yield event


def build(in_dir: str, out_dir: str) -> Pipeline:
    p = Pipeline("dedupe", parallelism=2,
                 checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
    (p.source(FileSource(in_dir, format="jsonl"), uid="events")
       .key_by(lambda event: event["id"])
       .process(FirstOfEachId(), uid="dedupe")
       .sink(FileSink(out_dir, format="jsonl"), uid="out"))
    return p


def main() -> Pipeline:
    """The pipeline of the command line's folders (``lockgate run`` calls this)."""
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} IN_DIR OUT_DIR")
    return build(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main().run()
