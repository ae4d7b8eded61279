"""The public API end to end on the ``local`` launcher: real task processes,
real files, exact output.

Functions and classes the tasks run are defined at module level, so the task
processes import them from this module (cloudpickle pickles them by reference).
"""

from __future__ import annotations

import csv
import json
import logging
import os
import random
import re
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lockgate import (
    CheckpointConfig,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    NoRestart,
    Pipeline,
    RuntimeContext,
    ValueStateDescriptor,
)
from lockgate.checkpoint import storage
from lockgate.connectors import (
    CollectSink,
    FileSink,
    FileSource,
    SequenceSource,
    Source,
    SourceReader,
    TaskInfo,
)
from lockgate.errors import PipelineDefinitionError
from lockgate.graph.jobgraph import build_job_graph
from tests.fault.sums_job import build as build_sums
from tests.fixtures import check_exact_sums, committed_lines, hidden_files, visible_files

LAUNCHER = "local"  # explicit: the default launcher may change


def _config(tmp_path: Path, **kw: Any) -> CheckpointConfig:
    return CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk"), **kw)


# ------------------------------------------------------- stateless operators


def tag_with_pid(batch: list[int]) -> list[tuple[int, int]]:
    """A ``map_batch`` function: add one, and say which task process did it."""
    pid = os.getpid()
    return [(pid, x + 1) for x in batch]


def test_stateless_operators_give_the_exact_multiset(tmp_path: Path) -> None:
    n = 3000
    sink = CollectSink(str(tmp_path / "collect"))
    p = Pipeline("ops", parallelism=2, batch_size=100, checkpoint=_config(tmp_path),
                 restart=NoRestart())
    (p.source(SequenceSource(1, n), uid="numbers")
       .map(lambda x: x * 3, uid="triple")
       .filter(lambda x: x % 2 == 0, uid="even")
       .flat_map(lambda x: [x, -x], uid="plus-minus")
       .rebalance()
       .map_batch(tag_with_pid, uid="tag", parallelism=3)
       .sink(sink, uid="out", parallelism=3))
    result = p.run(launcher=LAUNCHER)

    got = sink.results()
    expected = Counter(y + 1 for x in range(1, n + 1) if x * 3 % 2 == 0 for y in (x * 3, -x * 3))
    assert Counter(v for _, v in got) == expected
    assert all(type(r) is tuple for r in got)  # records keep their type through the sink
    # rebalance spread the batches over all three map_batch tasks
    per_task = Counter(pid for pid, _ in got)
    assert len(per_task) == 3, per_task
    assert all(c >= len(got) // 6 for c in per_task.values()), per_task
    assert (result.status, result.guarantee, result.restarts) == ("finished", "exactly_once", 0)
    assert (result.records_in, result.records_out) == (n, len(got))


# ---------------------------------------------------- KeyedProcessFunction

WORDS = ["apple", "kiwi", "fig", "plum", "pear", "lime", "date"]
N_EVENTS = 2100


def to_event(i: int) -> dict[str, Any]:
    return {"id": i, "word": WORDS[i % len(WORDS)], "last": i >= N_EVENTS - len(WORDS)}


def word_of(event: dict[str, Any]) -> str:
    return str(event["word"])


class Profile(KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Per word: a count (value state), the ids seen (list state) and how many
    ids were even and odd (map state). On a word's last event it emits the
    whole state, clears it and emits what is left."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
        self.ids = ctx.get_list_state(ListStateDescriptor("ids"))
        self.parity = ctx.get_map_state(MapStateDescriptor("parity"))

    def process_element(self, value: dict[str, Any],
                        ctx: RuntimeContext) -> Iterable[tuple[Any, ...]]:
        n = self.count.value() + 1
        self.count.update(n)
        self.ids.add(value["id"])
        side = "even" if value["id"] % 2 == 0 else "odd"
        self.parity.put(side, self.parity.get(side, 0) + 1)
        yield ("count", ctx.current_key, n)
        if value["last"]:
            yield ("state", ctx.current_key, self.count.value(), self.ids.get(),
                   sorted(self.parity.items()), self.parity.contains("even"))
            self.count.clear()
            self.ids.update([])
            for side in self.parity.keys():
                self.parity.remove(side)
            yield ("cleared", ctx.current_key, self.count.value(), self.ids.get(),
                   self.parity.is_empty())

    def end_input(self, ctx: RuntimeContext) -> Iterable[tuple[Any, ...]]:
        return [("end_input", ctx.uid, ctx.task_index, ctx.parallelism)]

    def finish(self, ctx: RuntimeContext) -> Iterable[tuple[Any, ...]]:
        return [("finish", ctx.uid, ctx.task_index, ctx.parallelism)]


def test_keyed_process_function_with_value_list_and_map_state(tmp_path: Path) -> None:
    sink = CollectSink(str(tmp_path / "collect"))
    p = Pipeline("profile", parallelism=2, checkpoint=_config(tmp_path), restart=NoRestart())
    # one source task: every word's events reach its keyed task in id order
    (p.source(SequenceSource(0, N_EVENTS - 1), uid="ids", parallelism=1)
       .map(to_event, uid="events", parallelism=1)
       .key_by(word_of)
       .process(Profile(), uid="profile")
       .sink(sink, uid="out"))
    p.run(launcher=LAUNCHER)
    got = sink.results()

    expected: list[tuple[Any, ...]] = []
    for w in WORDS:
        ids = [i for i in range(N_EVENTS) if WORDS[i % len(WORDS)] == w]
        expected += [("count", w, c) for c in range(1, len(ids) + 1)]
        parity = [("even", sum(i % 2 == 0 for i in ids)), ("odd", sum(i % 2 for i in ids))]
        expected.append(("state", w, len(ids), ids, parity, True))
        expected.append(("cleared", w, 0, [], True))
    for t in range(2):
        expected += [("end_input", "profile", t, 2), ("finish", "profile", t, 2)]
    assert sorted(got, key=repr) == sorted(expected, key=repr)

    # Each task's records come out in order (results() reads file by file, task
    # by task): per word count, state, cleared; then end_input and finish of
    # that task, once, last. Words never cross tasks.
    ends = [i for i, r in enumerate(got) if r[0] == "end_input"]
    assert [got[i][2] for i in ends] == [0, 1] and ends[-1] == len(got) - 2
    segments = [got[:ends[0]], got[ends[0] + 2:ends[1]]]
    for t, i in enumerate(ends):
        assert got[i + 1] == ("finish", "profile", t, 2)
    assert not {r[1] for r in segments[0]} & {r[1] for r in segments[1]}
    for seg in segments:
        for w in {r[1] for r in seg}:
            mine = [r for r in seg if r[1] == w]
            assert [r[0] for r in mine[-2:]] == ["state", "cleared"]
            assert [r[2] for r in mine[:-2]] == list(range(1, len(mine) - 1))


# ------------------------------------------------- file source and file sink

ROWS_PER_FILE = 300


def _rows(fmt: str, file_no: int) -> list[dict[str, Any]]:
    base = {"jsonl": 0, "csv": 10_000, "parquet": 20_000}[fmt] + file_no * 1000
    names = ["plain", 'comma, and "quotes"', "Zoë ünïcode", "line\nbreak", ""]
    return [{"id": base + i, "name": f"{names[i % len(names)]}{i}", "score": (base + i) / 4}
            for i in range(ROWS_PER_FILE)]


def jsonl_row(r: dict[str, Any]) -> dict[str, Any]:
    return {"src": "jsonl", "id": r["id"], "name": r["name"], "score": float(r["score"])}


def csv_row(r: dict[str, Any]) -> dict[str, Any]:
    return {"src": "csv", "id": int(r["id"]), "name": r["name"], "score": float(r["score"])}


def parquet_row(r: dict[str, Any]) -> dict[str, Any]:
    return {"src": "parquet", "id": r["id"], "name": r["name"], "score": r["score"]}


def test_file_source_jsonl_csv_parquet_to_parquet_file_sink(tmp_path: Path) -> None:
    src = tmp_path / "in"
    expected: list[dict[str, Any]] = []
    for fmt in ("jsonl", "csv", "parquet"):
        folder = src / fmt
        (folder / "sub").mkdir(parents=True)
        # hidden files are never read: their content would fail the job
        (folder / ".hidden.tmp").write_text("not a record\n")
        (folder / "_SUCCESS").write_text("")
        for k in range(2):
            rows = _rows(fmt, k)
            expected += [{"src": fmt, **r} for r in rows]
            path = folder / ("sub" if k else "") / f"part{k}.{fmt}"
            if fmt == "jsonl":
                path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            elif fmt == "csv":
                with open(path, "w", newline="", encoding="utf-8") as f:
                    w = csv.DictWriter(f, fieldnames=["id", "name", "score"])
                    w.writeheader()
                    w.writerows(rows)
            else:
                pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=70)

    out = tmp_path / "out"
    p = Pipeline("formats", parallelism=2, checkpoint=_config(tmp_path), restart=NoRestart())
    for fmt, fn in (("jsonl", jsonl_row), ("csv", csv_row), ("parquet", parquet_row)):
        (p.source(FileSource(str(src / fmt), format=fmt), uid=f"read-{fmt}")
           .map(fn, uid=f"normalize-{fmt}")
           .sink(FileSink(str(out), format="parquet"), uid=f"write-{fmt}"))
    result = p.run(launcher=LAUNCHER)

    table = pq.read_table(out)
    assert table.schema.field("id").type == pa.int64()
    assert table.schema.field("score").type == pa.float64()
    key = lambda r: (r["src"], r["id"])
    assert sorted(table.to_pylist(), key=key) == sorted(expected, key=key)
    assert hidden_files(out) == []
    assert result.records_in == result.records_out == 6 * ROWS_PER_FILE


# ------------------------------------------------------- at-least-once mode


def test_at_least_once_mode_is_exact_without_failures(tmp_path: Path) -> None:
    n = 20_000
    out = tmp_path / "out"
    # rate-limited to at least 0.5 s, so periodic checkpoints (interval 0.1 s)
    # normally pass while records flow through the two-input keyed tasks
    p = build_sums(n, 2, 3, str(out), str(tmp_path / "chk"), 0.1, mode="at_least_once",
                   rate=40_000)
    result = p.run(launcher=LAUNCHER)
    check_exact_sums(out, n, 3)
    assert (result.guarantee, result.restarts) == ("at_least_once", 0), result.failures
    assert (result.records_in, result.records_out) == (n, n)
    assert result.completed_checkpoints


# ---------------------------------------------- resuming from a checkpoint


def words_of(line: dict[str, Any]) -> list[tuple[str, int]]:
    return [(w, 1) for w in str(line["text"]).split()]


def first(pair: tuple[str, int]) -> str:
    return pair[0]


def add_counts(a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
    return (a[0], a[1] + b[1])


def _word_count(src: Path, out: Path, chk: Path) -> Pipeline:
    p = Pipeline("words", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(chk)),
                 restart=NoRestart())
    (p.source(FileSource(str(src), format="jsonl"), uid="lines")
       .flat_map(words_of, uid="words")
       .key_by(first)
       .reduce(add_counts, uid="counts")
       .sink(FileSink(str(out), format="jsonl"), uid="out"))
    return p


def test_run_from_checkpoint_continues_sources_state_and_sink(tmp_path: Path) -> None:
    """Run 1 reads a.jsonl to the end; run 2 starts from run 1's retained final
    checkpoint after b.jsonl appeared: it must read only b.jsonl and continue
    every word's count from its checkpointed value."""
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(40)]
    texts = {name: [" ".join(rng.choices(vocab, k=rng.randint(1, 6))) for _ in range(600)]
             for name in ("a", "b")}
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts["a"]))

    first_run = _word_count(src, out, tmp_path / "chk-1").run(launcher=LAUNCHER)
    assert first_run.latest_checkpoint is not None
    meta = storage.read_metadata(first_run.latest_checkpoint)
    words_a = sum(len(t.split()) for t in texts["a"])
    assert (meta.progress.read, meta.progress.written) == (len(texts["a"]), words_a)
    before = visible_files(out)

    (src / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts["b"]))
    second = _word_count(src, out, tmp_path / "chk-2").run(
        launcher=LAUNCHER, from_checkpoint=first_run.latest_checkpoint)

    # run 1's committed files are untouched; both runs together counted every
    # word exactly once per occurrence
    assert {k: v for k, v in visible_files(out).items() if k in before} == before
    counts: dict[str, list[int]] = {}
    for w, c in committed_lines(out):
        counts.setdefault(w, []).append(c)
    total = Counter(w for name in ("a", "b") for t in texts[name] for w in t.split())
    assert {w: sorted(cs) for w, cs in counts.items()} == {
        w: list(range(1, c + 1)) for w, c in total.items()}
    assert hidden_files(out) == []
    assert second.restarts == 0
    assert (second.records_in, second.records_out) == (1200, sum(total.values()))


# ------------------------------------------------------------------- uids


def double(x: int) -> int:
    return 2 * x


def _uidless(tmp_path: Path) -> Pipeline:
    p = Pipeline("uids", parallelism=2, checkpoint=_config(tmp_path), restart=NoRestart())
    (p.source(SequenceSource(1, 500), uid="numbers")
       .map(double)
       .sink(CollectSink(str(tmp_path / "collect")), uid="out"))
    return p


def test_operator_without_uid_warns_and_gets_a_deterministic_uid(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match=r"without a uid .*\(map-1\).*uid='\.\.\.'"):
        result = _uidless(tmp_path).run(launcher=LAUNCHER)
    assert result.latest_checkpoint is not None
    meta = storage.read_metadata(result.latest_checkpoint)
    assert sorted(meta.operators) == ["map-1", "numbers", "out"]
    expected = [2 * x for x in range(1, 501)]
    assert sorted(CollectSink(str(tmp_path / "collect")).results()) == expected
    # The same pipeline built again generates the same uid, so it restores the
    # final checkpoint (a checkpoint with an unknown uid is refused): nothing is
    # left to read, and nothing is written twice.
    with pytest.warns(UserWarning, match=r"\(map-1\)"):
        again = _uidless(tmp_path).run(launcher=LAUNCHER,
                                       from_checkpoint=result.latest_checkpoint)
    assert (again.records_in, again.restarts) == (500, 0)
    assert sorted(CollectSink(str(tmp_path / "collect")).results()) == expected


def test_no_uid_warning_when_every_operator_has_one(tmp_path: Path) -> None:
    p = Pipeline("uids")
    p.source(SequenceSource(1, 5), uid="numbers").map(double, uid="double").sink(
        CollectSink(str(tmp_path / "c")), uid="out")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*without a uid")
        graph = build_job_graph(p)
    assert [op.uid for op in graph.operators()] == ["numbers", "double", "out"]


def test_generated_uid_never_takes_a_given_one(tmp_path: Path) -> None:
    p = Pipeline("uids")
    p.source(SequenceSource(1, 5), uid="map-1").map(double).sink(
        CollectSink(str(tmp_path / "c")), uid="out")
    with pytest.warns(UserWarning, match=r"\(map-1_\)"):
        graph = build_job_graph(p)
    assert [op.uid for op in graph.operators()] == ["map-1", "map-1_", "out"]


def test_duplicate_and_malformed_uids_are_refused() -> None:
    p = Pipeline("uids")
    s = p.source(SequenceSource(1, 5), uid="numbers")
    with pytest.raises(PipelineDefinitionError, match="uid 'numbers' is used twice"):
        s.map(double, uid="numbers")
    with pytest.raises(PipelineDefinitionError, match="uid 'out' is used twice"):
        s.map(double, uid="out").sink(CollectSink(), uid="out")
    with pytest.raises(PipelineDefinitionError, match="may only contain"):
        s.map(double, uid="has space")


# ----------------------------------------------------- guarantees and replay


class ListSource(Source[int]):
    """A source that cannot rewind (think of a socket): not replayable."""

    replayable = False

    def __init__(self, records: list[int]) -> None:
        self.records = records

    def create_reader(self, info: TaskInfo) -> SourceReader[int]:
        return ListReader(self.records[info.task_index::info.parallelism])


class ListReader(SourceReader[int]):
    def __init__(self, records: list[int]) -> None:
        self.records = records
        self.pos = 0

    def restore(self, state: list[Any] | None) -> None:
        pass  # nothing to rewind to

    def poll(self, max_records: int) -> list[int] | None:
        if self.pos >= len(self.records):
            return None
        batch = self.records[self.pos:self.pos + max_records]
        self.pos += len(batch)
        return batch

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return []


def _from_list(tmp_path: Path, sink: CollectSink) -> Pipeline:
    p = Pipeline("once", parallelism=2, checkpoint=_config(tmp_path), restart=NoRestart())
    p.source(ListSource(list(range(3000))), uid="socket").map(double, uid="double").sink(
        sink, uid="out")
    return p


def test_non_replayable_source_is_refused_under_exactly_once(tmp_path: Path) -> None:
    sink = CollectSink(str(tmp_path / "collect"))
    with pytest.raises(PipelineDefinitionError) as e:
        _from_list(tmp_path, sink).run(launcher=LAUNCHER)
    msg = str(e.value)
    assert "['socket'] cannot be replayed" in msg
    assert "allow_non_replayable=['socket']" in msg and "or True for every such source" in msg
    assert sink.results() == []


def test_non_replayable_source_runs_downgraded_when_allowed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = CollectSink(str(tmp_path / "collect"))
    with caplog.at_level(logging.WARNING, logger="lockgate.driver"):
        result = _from_list(tmp_path, sink).run(launcher=LAUNCHER, allow_non_replayable=True)
    assert result.guarantee == "at_most_once"
    assert "AT-MOST-ONCE" in caplog.text
    assert sorted(sink.results()) == [2 * x for x in range(3000)]


# --------------------------------------------------------------------- CLI

APP = """\
import sys

from lockgate import CheckpointConfig, NoRestart, Pipeline
from lockgate.connectors import FileSink, SequenceSource

print("app arguments:", sys.argv[1:], file=sys.stderr)
n = int(sys.argv[sys.argv.index("--n") + 1]) if "--n" in sys.argv else 5000
pipeline = Pipeline("cli-app", parallelism=2, restart=NoRestart(),
                    checkpoint=CheckpointConfig(interval=0.2, storage={chk!r}))
(pipeline.source(SequenceSource(1, n), uid="numbers")
    .map(lambda x: x * 2, uid="double")
    .sink(FileSink({out!r}, format="jsonl"), uid="out"))

unused = Pipeline("unused")
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lockgate.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_cli_run_and_inspect(tmp_path: Path) -> None:
    chk, out = tmp_path / "chk", tmp_path / "out"
    app = tmp_path / "app.py"
    app.write_text(APP.format(chk=str(chk), out=str(out)))

    # lockgate's options after the app, then the app's own (as documented)
    run = _cli("run", f"{app}:pipeline", "--launcher", "local", "--parallelism", "3",
               "--n", "4000", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "app arguments: ['--n', '4000']" in run.stderr
    assert "spark" not in run.stderr.lower(), run.stderr  # the local launcher ran it
    assert re.fullmatch(r"job cli-app-\w+ finished in [\d.]+ s: 4000 records in, 4000 out, "
                        r"[1-9]\d* checkpoints, 0 restarts, guarantee exactly_once\n",
                        run.stdout), run.stdout
    progress = re.findall(r"checkpoint (\d+) \((?:\d+ ms|-)\): ([\d,]+) records read, "
                          r"([\d,]+) written, 0 restarts", run.stderr)
    assert progress, run.stderr
    assert progress[-1][1:] == ("4,000", "4,000")
    doubled: list[Any] = sorted(committed_lines(out))  # JSON lines of single numbers
    assert doubled == [2 * x for x in range(1, 4001)]

    job_dir = next(chk.iterdir())
    latest = storage.latest_completed(job_dir)
    assert latest is not None and Path(latest).name == f"chk-{progress[-1][0]}"
    inspect = _cli("inspect", str(latest), cwd=tmp_path)
    assert inspect.returncode == 0, inspect.stderr
    info = json.loads(inspect.stdout)
    assert info["checkpoint_id"] == int(progress[-1][0]) and info["job_id"] == job_dir.name
    assert {uid: op["parallelism"] for uid, op in info["operators"].items()} == {
        "numbers": 3, "double": 3, "out": 3}


def test_cli_names_the_pipeline_it_cannot_pick(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP.format(chk=str(tmp_path / "chk"), out=str(tmp_path / "out")))
    both = _cli("run", str(app), cwd=tmp_path)
    assert both.returncode == 2 and "defines 2 Pipeline objects" in both.stderr
    # everything after "--" is the app's, also what lockgate would understand
    missing = _cli("run", f"{app}:nope", "--launcher", "local", "x", "--", "--parallelism", "9",
                   cwd=tmp_path)
    assert missing.returncode == 2
    assert "app arguments: ['x', '--parallelism', '9']" in missing.stderr
    assert "no Pipeline named 'nope'" in missing.stderr and "pipeline" in missing.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "chk").exists()


def test_cli_messages_a_new_user_meets(tmp_path: Path) -> None:
    """Each mistake gets one line naming it and the fix, and no traceback; a
    job that cannot start never says it starts."""
    app = tmp_path / "app.py"
    app.write_text(APP.format(chk=str(tmp_path / "chk"), out=str(tmp_path / "out")))

    def fails(*args: str) -> str:
        run = _cli(*args, cwd=tmp_path)
        assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
        assert " starts" not in run.stderr, run.stderr
        return run.stderr

    assert "missing.py does not exist" in fails("run", "missing.py")
    assert "--parallelism: must be 1 or more, got 0" in fails(
        "run", f"{app}:pipeline", "--launcher", "local", "--parallelism", "0")
    nowhere = str(tmp_path / "nowhere")
    assert f"savepoint folder {nowhere} does not exist" in fails(
        "run", f"{app}:pipeline", "--launcher", "local", "--from-savepoint", nowhere)
    # a job's checkpoint folder given for a checkpoint: names its latest
    done = _cli("run", f"{app}:pipeline", "--launcher", "local", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    job_dir = next((tmp_path / "chk").iterdir())
    message = fails("run", f"{app}:pipeline", "--launcher", "local",
                    "--from-checkpoint", str(job_dir))
    assert "is a job's checkpoint folder, not a checkpoint" in message
    assert str(storage.latest_completed(job_dir)) in message
    # the flag before the path
    info = _cli("savepoint", "inspect", "--json", str(storage.latest_completed(job_dir)),
                cwd=tmp_path)
    assert info.returncode == 0 and json.loads(info.stdout)["kind"] == "checkpoint", info.stderr
    # a reader that goes away early: no BrokenPipeError
    head = subprocess.run(f"{sys.executable} -m lockgate.cli savepoint inspect "
                          f"{storage.latest_completed(job_dir)} | head -n 1", shell=True,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert head.stdout.startswith("checkpoint ") and "Error" not in head.stderr, head.stderr
