"""The driver JVM without Spark's launcher JVM (lockgate/cluster/spark/gateway.py):
the first local session learns the command spark-submit runs, the next ones
run it directly; a learned command that does not start is forgotten and
spark-submit starts the session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SESSION = """
import json, os, sys
from pyspark import SparkContext
from lockgate.cluster.spark import session as spark_session

sc = spark_session.spark_context(None, "local[2]", 2, "gateway-test")
total = sc.parallelize(range(10), 2).map(lambda x: x * 2).sum()
print(json.dumps({"command": SparkContext._gateway.proc.args, "total": total,
                  "hashseed": sc.environment.get("PYTHONHASHSEED")}))
"""


def _session(tmp_path: Path) -> dict[str, object]:
    script = tmp_path / "session.py"
    script.write_text(SESSION)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), LOCKGATE_SPARK_CDS="0")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["total"] == 90
    return result


def test_the_second_session_starts_its_jvm_directly(tmp_path: Path) -> None:
    first = _session(tmp_path)
    assert str(first["command"][0]).endswith("spark-submit")  # type: ignore[index]
    learned = list((tmp_path / "cache" / "lockgate" / "spark-launch").glob("*.json"))
    assert len(learned) == 1
    kept = json.loads(learned[0].read_text())
    assert kept["prefix"][-1] == "org.apache.spark.deploy.SparkSubmit"
    assert kept["added"]["PYTHONHASHSEED"] == "0"  # what spark-submit exports
    second = _session(tmp_path)
    command = [str(c) for c in second["command"]]  # type: ignore[attr-defined]
    assert command[:len(kept["prefix"])] == kept["prefix"]  # java itself, no launcher
    assert command[-1] == "pyspark-shell" and "spark.app.name=gateway-test" in command
    # a learned command that no longer starts (Java moved): spark-submit, and learned anew
    kept["prefix"][0] = str(tmp_path / "gone" / "java")
    learned[0].write_text(json.dumps(kept))
    third = _session(tmp_path)
    assert str(third["command"][0]).endswith("spark-submit")  # type: ignore[index]
    assert json.loads(learned[0].read_text())["prefix"][0] != str(tmp_path / "gone" / "java")


REFUSED = """
import json, os, sys, threading
from lockgate import Pipeline
from lockgate.errors import PipelineDefinitionError
from lockgate.connectors import CollectSink, SequenceSource

from lockgate.cluster.spark import gateway as spark_gateway

spawned = []  # the JVMs started from the learned command (watched, not replaced)
spawn = spark_gateway.spawn
spark_gateway.spawn = lambda *a, **k: spawned.append(spawn(*a, **k)) or spawned[-1]

lock = threading.Lock()
p = Pipeline("refused", parallelism=1)
p.source(SequenceSource(1, 10), uid="numbers").map(lambda x: (lock, x)[1], uid="m").sink(
    CollectSink(), uid="out")
try:
    p.run(launcher="spark", master="local[2]")
except PipelineDefinitionError as e:
    print("refused:", str(e)[:80], file=sys.stderr)
else:
    sys.exit("not refused")
from lockgate.cluster.spark import warm as spark_warm
from pyspark import SparkContext
assert SparkContext._active_spark_context is None
for p in list(spark_warm._started):
    p.wait(60)  # the warm daemon ends once told
assert len(spawned) == 1 and spawned[0] is not None, spawned  # it started early
assert spawned[0].proc.returncode is not None  # and was ended
children = os.popen(f"ps -o pid=,args= --ppid {os.getpid()}").read().split("\\n")
print(json.dumps([c for c in children if c.strip() and "ps -o" not in c]))
"""


def test_a_refused_job_leaves_no_jvm_behind(tmp_path: Path) -> None:
    _session(tmp_path)  # a learned command: the refused job's JVM starts early
    (tmp_path / "refused.py").write_text(REFUSED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), LOCKGATE_SPARK_CDS="0")
    out = subprocess.run([sys.executable, str(tmp_path / "refused.py")], capture_output=True,
                         text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "refused: the function of operator 'm' cannot be sent" in out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []  # no java, no warm daemon


EARLY = """
import json, sys
from lockgate import Pipeline
from lockgate.connectors import CollectSink, SequenceSource
from lockgate.cluster.spark import gateway as spark_gateway

seen = []  # what the driver had imported when the JVM was started
spawn = spark_gateway.spawn

def watched(*a, **k):
    seen.append({m: m in sys.modules for m in ("pyspark", "lockgate.cluster.jobmaster",
                                               "lockgate.cluster.submission")})
    return spawn(*a, **k)

spark_gateway.spawn = watched
sink = CollectSink()
p = Pipeline("early", parallelism=1)
p.source(SequenceSource(1, 20), uid="numbers").map(lambda x: x * 3, uid="m").sink(sink, uid="out")
p.run(launcher="spark", master="local[2]", fresh=True)  # each run of the script anew
warm = spark_gateway.last_warm_up
print(json.dumps({"seen": seen, "total": sum(sink.results()),
                  "warm_up": warm and {"error": warm.error, "seconds": warm.seconds}}))
"""


def _early(tmp_path: Path, **env_vars: str) -> dict[str, Any]:
    (tmp_path / "early.py").write_text(EARLY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), LOCKGATE_SPARK_CDS="0",
               LOCKGATE_PROGRESS="0", **env_vars)
    out = subprocess.run([sys.executable, str(tmp_path / "early.py")], capture_output=True,
                         text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["total"] == 3 * sum(range(1, 21))
    return result


def test_the_jvm_starts_before_the_driver_imports_pyspark_and_the_job_master(
        tmp_path: Path) -> None:
    _session(tmp_path)  # a learned command: the job's JVM starts from it
    result = _early(tmp_path)
    # one JVM, started before PySpark (a tenth of a second or more of imports)
    # and the job master's modules were imported: they load while it starts
    assert result["seen"] == [{"pyspark": False, "lockgate.cluster.jobmaster": False,
                               "lockgate.cluster.submission": False}]
    # the first job's context-free JVM work ran beside the context's start
    assert result["warm_up"]["error"] is None and result["warm_up"]["seconds"] > 0
    assert _early(tmp_path, LOCKGATE_SPARK_WARMUP="0")["warm_up"] is None
