"""Keyed state with a KeyedProcessFunction: word counts, and the first time
each word was seen, over a folder of JSONL files.

    python examples/word_count_state.py IN_DIR OUT_DIR
    lockgate run examples/word_count_state.py IN_DIR OUT_DIR
    spark-submit --master 'local[4]' examples/word_count_state.py IN_DIR OUT_DIR
"""

import sys

from lockgate import (
    CheckpointConfig,
    KeyedProcessFunction,
    ListStateDescriptor,
    Pipeline,
    ValueStateDescriptor,
)
from lockgate.connectors import FileSink, FileSource


class CountWords(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
        self.lines = ctx.get_list_state(ListStateDescriptor("first-lines"))

    def process_element(self, value, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        if n <= 2:
            self.lines.add(value["line"])
        yield {"word": ctx.current_key, "count": n}

    def finish(self, ctx):
        return [{"word": "<end>", "count": 0}]


def build(in_dir: str, out_dir: str) -> Pipeline:
    p = Pipeline("word-count", parallelism=2,
                 checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
    (p.source(FileSource(in_dir, format="jsonl"), uid="lines")
       .flat_map(lambda rec: [{"word": w, "line": rec["n"]} for w in rec["text"].split()],
                 uid="words")
       .key_by(lambda rec: rec["word"])
       .process(CountWords(), uid="counts")
       .sink(FileSink(out_dir, format="parquet"), uid="out"))
    return p


def main() -> Pipeline:
    """The pipeline of the command line's folders (``lockgate run`` calls this)."""
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} IN_DIR OUT_DIR")
    return build(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main().run()
