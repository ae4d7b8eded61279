"""Workload W3, Kafka → running sums → Kafka, side by side on one broker:
Lockgate (exactly-once, both launchers) and the bare confluent-kafka loop
(``bare_loop.py``, with and without transactions; the transactional one
with each ``--bare-linger``) and, where installed,
the peers Quix Streams and Bytewax (``quix_w3.py``, ``bytewax_w3.py``, run
with their own interpreter), interleaved round by round; medians of the
rounds. Beside records/s, the CPU seconds of all the
system's processes per million records (less sensitive to other work on the
machine than the rate): for Lockgate the driver, the fork server and the
tasks (on Spark also its JVM and Python workers), for the bare loop and
the peers their worker processes; the broker's own CPU is printed apart.

    python -m benchmarks.kafka [--n 2000000] [--rounds 3] [--parallelism 2]
        [--interval 1.0] [--launchers local spark] [--no-bare] [--bare-linger 5 50]
        [--peers-python PATH | --no-peers] [--bootstrap host:port] [--record]

Topic ``in`` has 4 partitions holding the integers 1..N; key ``x % 1000``;
one ``[key, sum]`` record per input to a fresh output topic; a checkpoint
(or transaction) every ``--interval`` seconds. Lockgate's output is checked
(every key's running sums exact, read with ``read_committed``); so is each
peer's: exactly N records for exactly-once Quix Streams (and its sums), at
least N for at-least-once Bytewax, or the round has no figure (a peer's
median is of its other rounds; the failed ones are counted beside it, and
the failed run's output is kept in a temporary file). The peers run
with ``--peers-python`` (or ``LOCKGATE_PEERS_PYTHON``, or
``.venv-peers/bin/python`` in the repository, or this interpreter if it has
them): an interpreter with ``benchmarks/kafka/requirements-peers.txt``
installed; without one they are left out, with a line saying how to install
them. Without
``--bootstrap`` (or ``LOCKGATE_KAFKA``) the benchmark starts its own
noida-db broker, its data in ``--broker-dir`` (default ``/dev/shm``: in
memory, off the disk the job's checkpoints use); every round's output topic
is deleted after it is checked (that broker keeps its topics in memory).
``--record`` appends a line per system to ``benchmarks/results/kafka.jsonl``
(a peer's with its version).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.kafka import BROKER_DIR, bare_loop  # noqa: E402
from benchmarks.nexmark.measure import JobUsage, _stat  # noqa: E402
from benchmarks.record import record  # noqa: E402
from lockgate.cluster.interrupt import descendants  # noqa: E402
from tests.connectors.kafka_server import noida_broker  # noqa: E402
from tests.connectors.kafka_sums_job import build  # noqa: E402
from tests.connectors.kafka_topics import (  # noqa: E402
    delete_topic,
    new_topic,
    produce_numbers,
    read_all,
    sums_of,
)
from tests.fixtures import check_running_sums  # noqa: E402

BROKER = "noida-db"
PEERS = {  # name: (package, script, guarantee)
    "quix streams": ("quixstreams", "quix_w3", "exactly-once"),
    "bytewax": ("bytewax", "bytewax_w3", "at-least-once"),
}
INSTALL_PEERS = ("python3 -m venv .venv-peers && .venv-peers/bin/pip install "
                 "-r benchmarks/kafka/requirements-peers.txt")


def broker_cpu() -> float:
    """CPU seconds of the broker this benchmark started (0 for one given)."""
    return sum(st[1] for pid in descendants(os.getpid())
               if (st := _stat(pid)) is not None and st[0] == BROKER)


def measured(run: Callable[[], float]) -> tuple[float, float, float]:
    """``run()``'s wall time, the CPU seconds of this process's other
    descendants meanwhile (the system's processes: the broker's left out) and
    the broker's."""
    usage = JobUsage()
    usage.start()
    broker = broker_cpu()
    wall = run()
    broker = broker_cpu() - broker
    return wall, usage.finish(settle=5.0)["cpu_s"] - broker, broker


def lockgate_round(args: argparse.Namespace, bootstrap: str, source: str,
                   launcher: str) -> tuple[float, float, float]:
    out = new_topic(bootstrap, f"w3-{launcher}", 4)
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-w3-"))
    try:
        p = build(bootstrap, source, out, parallelism=args.parallelism, keys=args.keys,
                  storage=str(tmp / "chk"), interval=args.interval)

        def job() -> float:
            t0 = time.perf_counter()
            result = p.run(launcher=launcher, progress=False)
            assert result.status == "finished", result
            return time.perf_counter() - t0

        measures = measured(job)
        if args.check:
            check_running_sums(sums_of(read_all(bootstrap, out, timeout=300)), args.n, args.keys)
        return measures
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        delete_topic(bootstrap, out)  # the broker keeps its topics in memory


def bare_round(args: argparse.Namespace, bootstrap: str, source: str,
               transactions: bool, linger: int) -> tuple[float, float, float]:
    out = new_topic(bootstrap, "w3-bare", 4)
    loop = argparse.Namespace(bootstrap=bootstrap, input=source, output=out,
                              workers=args.parallelism, keys=args.keys,
                              interval=args.interval, transactions=transactions,
                              linger=linger)
    try:
        return measured(lambda: bare_loop.run(loop))
    finally:
        delete_topic(bootstrap, out)


def bare_name(linger: int) -> str:
    """The transactional bare loop's name in the table: its linger named
    unless it is librdkafka's default."""
    return "bare loop, transactions" + ("" if linger == 5 else f", linger {linger} ms")


def peers_python(given: str | None) -> str | None:
    """The interpreter to run the peers with: the one given, else the
    repository's ``.venv-peers``, else this one if it has a peer."""
    if given:
        return given
    venv = ROOT / ".venv-peers" / "bin" / "python"
    if venv.exists():
        return str(venv)
    if any(has_package(sys.executable, package) for package, _, _ in PEERS.values()):
        return sys.executable
    return None


def has_package(python: str, package: str) -> bool:
    """Whether ``python`` can import ``package`` and confluent-kafka."""
    probe = ("import importlib.util, sys; "
             f"sys.exit(any(importlib.util.find_spec(m) is None "
             f"for m in ({package!r}, 'confluent_kafka')))")
    try:
        return subprocess.run([python, "-c", probe], capture_output=True,
                              timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def peer_round(args: argparse.Namespace, bootstrap: str, source: str, name: str,
               python: str) -> tuple[float, float, float, dict[str, object]]:
    """One run of a peer's script: its wall time and CPU seconds (as it
    reports them), the broker's CPU seconds meanwhile and its JSON line. Raises
    if the run failed or its output does not hold what its guarantee says."""
    _, script, guarantee = PEERS[name]
    out = new_topic(bootstrap, f"w3-{script.split('_')[0]}", 4)
    command = [python, "-m", f"benchmarks.kafka.{script}", "--bootstrap", bootstrap,
               "--input", source, "--output", out, "--n", str(args.n),
               "--processes", str(args.parallelism), "--keys", str(args.keys),
               "--interval", str(args.interval)]
    try:
        broker = broker_cpu()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              timeout=600 + args.n / 1000,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        broker = broker_cpu() - broker
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            with tempfile.NamedTemporaryFile("w", prefix=f"w3-{script}-", suffix=".log",
                                             delete=False) as log:
                log.write(done.stderr)
            last = done.stderr.strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"exited with {done.returncode}: {last[0]} (its output: {log.name})")
        line = json.loads(lines[-1])
        count = len(records := read_all(bootstrap, out, timeout=300))
        if guarantee == "exactly-once":
            if count != args.n:
                raise RuntimeError(f"{out} holds {count:,} records, not {args.n:,}")
            if args.check:
                check_running_sums(sums_of(records), args.n, args.keys)
        elif count < args.n:
            raise RuntimeError(f"{out} holds {count:,} records, fewer than {args.n:,}")
    finally:
        delete_topic(bootstrap, out)
    line["output_records"] = count
    return float(line["wall_s"]), float(line["cpu_s"]), broker, line


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--launchers", nargs="*", default=["local", "spark"],
                    help="Lockgate's launchers (none: Lockgate left out)")
    ap.add_argument("--no-bare", action="store_true")
    ap.add_argument("--bare-linger", type=int, nargs="+", default=[5],
                    help="the bare transactional loop's linger.ms, a round of it for each "
                         "(default: 5, librdkafka's own; Lockgate's transactional sink "
                         "lingers 50)")
    ap.add_argument("--peers-python", default=os.environ.get("LOCKGATE_PEERS_PYTHON"),
                    help="an interpreter with benchmarks/kafka/requirements-peers.txt "
                         "installed, to run Quix Streams and Bytewax (default: "
                         "LOCKGATE_PEERS_PYTHON, .venv-peers/bin/python, this one)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-check", dest="check", action="store_false")
    ap.add_argument("--bootstrap", default=os.environ.get("LOCKGATE_KAFKA"))
    ap.add_argument("--broker-dir", default=BROKER_DIR,
                    help="where the benchmark's own broker keeps its data "
                         "(default: /dev/shm, in memory)")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    lingers = {bare_name(ms): ms for ms in args.bare_linger}
    systems = [] if args.no_bare else [*((name, "exactly-once") for name in lingers),
                                       ("bare loop", "none")]
    systems += [(f"lockgate {launcher}", "exactly-once") for launcher in args.launchers]
    python = None if args.no_peers else peers_python(args.peers_python)
    if python is not None:
        missing = [name for name, (package, _, _) in PEERS.items()
                   if not has_package(python, package)]
        systems += [(name, PEERS[name][2]) for name in PEERS if name not in missing]
        if missing:
            print(f"not run: {', '.join(missing)} (not installed in {python}: "
                  f"{INSTALL_PEERS})", flush=True)
    elif not args.no_peers:
        print(f"peers not run (Quix Streams, Bytewax): no interpreter with them; install "
              f"them with `{INSTALL_PEERS}` (or give --peers-python PATH)", flush=True)
    versions: dict[str, str] = {}
    failed: dict[str, int] = {}  # a peer's failed rounds: they have no figure
    outputs: dict[str, list[int]] = {}  # a peer's output records, round by round
    walls: dict[str, list[float]] = {name: [] for name, _ in systems}
    cpus: dict[str, list[float]] = {name: [] for name, _ in systems}
    brokers: dict[str, list[float]] = {name: [] for name, _ in systems}
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(noida_broker(args.broker_dir))
        source = new_topic(bootstrap, "w3-in", 4)
        produce_numbers(bootstrap, source, 1, args.n, 4)
        for r in range(args.rounds):
            for name, _ in systems:
                if name in PEERS:
                    assert python is not None
                    try:
                        wall, cpu, broker, line = peer_round(args, bootstrap, source, name,
                                                             python)
                    except (RuntimeError, AssertionError, subprocess.TimeoutExpired) as e:
                        failed[name] = failed.get(name, 0) + 1
                        print(f"round {r + 1}: {name}: FAILED, no figure: {e}", flush=True)
                        continue
                    versions[name] = str(line["version"])
                    outputs.setdefault(name, []).append(int(line["output_records"]))
                elif name.startswith("bare"):
                    wall, cpu, broker = bare_round(args, bootstrap, source,
                                                   "transactions" in name, lingers.get(name, 5))
                else:
                    wall, cpu, broker = lockgate_round(args, bootstrap, source,
                                                       name.split()[-1])
                walls[name].append(wall)
                cpus[name].append(cpu * 1e6 / args.n)
                brokers[name].append(broker * 1e6 / args.n)
                written = f", {outputs[name][-1]:,} records out" if name in PEERS else ""
                print(f"round {r + 1}: {name}: {args.n / wall:,.0f} records/s, "
                      f"{cpus[name][-1]:.2f} CPU s per million records (broker "
                      f"{brokers[name][-1]:.2f}){written}, load {os.getloadavg()[0]:.1f}",
                      flush=True)
    print(f"\nW3: N={args.n:,}, 4 partitions, p={args.parallelism}, keys={args.keys}, "
          f"interval {args.interval} s, median of {args.rounds} rounds")
    print(f"{'system':<40}{'guarantee':<14}{'records/s':>12}{'CPU s/M':>9}{'broker':>8}")
    for name, guarantee in systems:
        if not walls[name]:
            print(f"{name:<40}{guarantee:<14}{'failed':>12}")
            continue
        label = f"{name} {versions[name]}" if name in versions else name
        note = f"  ({failed[name]} of {args.rounds} rounds failed)" if name in failed else ""
        rate = args.n / statistics.median(walls[name])
        cpu, broker = statistics.median(cpus[name]), statistics.median(brokers[name])
        print(f"{label:<40}{guarantee:<14}{rate:>12,.0f}{cpu:>9.2f}{broker:>8.2f}{note}")
        if args.record:
            version = ({"version": versions[name], "output_records": max(outputs[name])}
                       if name in versions else {})
            record("kafka", [{"workload": "W3", "records": args.n, "partitions": 4,
                              "parallelism": args.parallelism, "interval_s": args.interval,
                              "system": name, **version, "guarantee": guarantee,
                              "records_per_s": round(rate), "rounds": len(walls[name]),
                              **({"failed_rounds": failed[name]} if name in failed else {}),
                              "cpu_s_per_million": round(cpu, 2),
                              "broker_cpu_s_per_million": round(broker, 2),
                              "stat": "median"}])


if __name__ == "__main__":
    main()
