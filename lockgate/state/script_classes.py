"""Classes of the job script, picklable by name in a task process.

A class defined in the user's script lives in the driver's ``__main__`` (or,
under ``lockgate run``, in a module that is not importable).
cloudpickle sends it to the tasks by value, inside the functions that use it,
but a task's own ``__main__`` is Lockgate's (or Spark's) entry point, so plain
``pickle`` (records on a channel, ``allow_pickle`` state) cannot find
``__main__.Point`` there: records fail to cross a channel, and state fails to
snapshot or to restore. :func:`register_script_classes` walks what the task
received (its operators' functions, their globals, closures and attributes)
and puts every class of the script into the task's ``__main__`` under its
name, so pickling by name works both ways, as it does in the driver.
"""

from __future__ import annotations

import linecache
import pickle
import re
import sys
import types
from typing import Any

__all__ = ["register_script_classes", "register_class", "script_classes", "script_traceback"]

SCRIPT = "__main__"


def _of_script(module: str) -> bool:
    """A class or function of this module is pickled by value by cloudpickle:
    the job script (``__main__``), or a module Python cannot import (the app
    ``lockgate run`` loaded from its file)."""
    return module == SCRIPT or module not in sys.modules


def register_class(cls: type) -> bool:
    """Make ``cls`` (a class of the job script) findable by its module and
    name in this process (``__main__.Point``); False if that name holds
    something else already."""
    if "." in cls.__qualname__:
        return False
    main = sys.modules.get(cls.__module__)
    if main is None:
        main = sys.modules[cls.__module__] = types.ModuleType(cls.__module__)
    current = getattr(main, cls.__qualname__, None)
    if current is cls:
        return True
    if current is not None:
        return False
    setattr(main, cls.__qualname__, cls)
    return True


def register_script_classes(*roots: Any) -> list[str]:
    """Register every class of the job script reachable from ``roots``;
    return their names."""
    return [cls.__qualname__ for cls in script_classes(*roots) if register_class(cls)]


def script_classes(*roots: Any) -> list[type]:
    """Every class of the job script reachable from ``roots``. Only objects of
    the script are followed (functions and classes whose module is
    ``__main__``, instances of them, containers), never an importable
    module's globals. The driver gives the classes of the whole pipeline to
    every task: a task may receive records of a class that none of its own
    functions names."""
    return _walk(*roots)[0]


_DYNAMIC = re.compile(r'File "<dynamic-code>", line (\d+), in (\S+)\n')


def script_traceback(trace: str, *roots: Any) -> str:
    """A task's traceback with the file and source line of the job script's
    functions put back: cloudpickle sends them by value and names their file
    ``<dynamic-code>``. ``roots`` are what the driver has of the pipeline; a
    function name that is not unique is left as it is."""
    files: dict[str, set[str]] = {}
    for fn in _walk(*roots)[1]:
        files.setdefault(fn.__code__.co_name, set()).add(fn.__code__.co_filename)

    def restore(m: re.Match[str]) -> str:
        line, name = int(m.group(1)), m.group(2)
        where = files.get(name, set())
        if len(where) != 1:
            return m.group(0)
        file = next(iter(where))
        source = linecache.getline(file, line).strip()
        return f'File "{file}", line {line}, in {name}\n' + (f"    {source}\n" if source else "")

    return _DYNAMIC.sub(restore, trace)


def _walk(*roots: Any) -> tuple[list[type], list[types.FunctionType]]:
    """The classes and the functions of the job script reachable from ``roots``."""
    found: list[type] = []
    functions: list[types.FunctionType] = []
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, type):
            if _of_script(obj.__module__):
                found.append(obj)
                todo.extend(vars(obj).values())
                todo.extend(obj.__bases__)
        elif isinstance(obj, (types.FunctionType, types.MethodType)):
            fn = obj.__func__ if isinstance(obj, types.MethodType) else obj
            assert isinstance(fn, types.FunctionType)
            if isinstance(obj, types.MethodType):
                todo.append(obj.__self__)
            if _of_script(fn.__module__):
                functions.append(fn)
                todo.extend(fn.__globals__.values())
                todo.extend(c.cell_contents for c in fn.__closure__ or ()
                            if _has_contents(c))
                todo.extend(fn.__defaults__ or ())
        elif isinstance(obj, (staticmethod, classmethod)):
            todo.append(obj.__func__)
        elif isinstance(obj, property):
            todo.extend(f for f in (obj.fget, obj.fset, obj.fdel) if f is not None)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif _of_script(type(obj).__module__):
            todo.append(type(obj))
            todo.extend(getattr(obj, "__dict__", {}).values())
    return found, functions


def dumps(obj: Any) -> bytes:
    """``pickle.dumps``; a class of the job script that this process does not
    know by name yet (one a task did not receive up front) is registered
    first, then pickled again."""
    try:
        return pickle.dumps(obj, protocol=5)
    except (pickle.PicklingError, AttributeError):
        if not register_script_classes(obj):
            raise
        return pickle.dumps(obj, protocol=5)


def _has_contents(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True
