"""Classes and functions of the job script, as tasks and the driver see them."""

from __future__ import annotations

import pickle
import runpy
import sys

from lockgate.state.script_classes import (
    register_script_classes,
    script_classes,
    script_traceback,
)

SCRIPT = """
from dataclasses import dataclass

@dataclass
class Reading:
    value: int

def parse(x):
    if x == 3:
        raise ValueError(x)
    return Reading(x)
"""


def test_classes_of_a_script_module_become_picklable_by_name(tmp_path):
    src = tmp_path / "job.py"
    src.write_text(SCRIPT)
    ns = runpy.run_path(str(src), run_name="lockgate_job_under_test")  # not importable
    assert "lockgate_job_under_test" not in sys.modules
    reading = ns["parse"](1)
    assert script_classes(ns["parse"]) == [ns["Reading"]]
    assert register_script_classes(ns["parse"]) == ["Reading"]
    try:
        assert pickle.loads(pickle.dumps(reading)) == reading
    finally:
        del sys.modules["lockgate_job_under_test"]


def test_a_traceback_names_the_scripts_file_and_line(tmp_path):
    src = tmp_path / "job.py"
    src.write_text(SCRIPT)
    ns = runpy.run_path(str(src), run_name="lockgate_job_under_test")
    trace = ('Traceback (most recent call last):\n'
             '  File "<dynamic-code>", line 10, in parse\n'
             'ValueError: 3\n')
    assert script_traceback(trace, ns["parse"]) == (
        'Traceback (most recent call last):\n'
        f'  File "{src}", line 10, in parse\n'
        '    raise ValueError(x)\n'
        'ValueError: 3\n')
    # a name the pipeline does not have stays as it was
    assert script_traceback(trace.replace("parse", "other"), ns["parse"]) == \
        trace.replace("parse", "other")
