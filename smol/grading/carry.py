"""Carrying a student's object out of their notebook's kernel, for the plain checks that
`python -m smol.grade` runs in processes of its own: `cloudpickle` (functions and
classes by value), plus what plain pickling refuses but a correct solution may hold.

- a lock (`threading.Lock`, `RLock`, and what is built on them: `Condition`, `Event`,
  `Semaphore`) arrives as a new, unlocked one;
- `threading.local` arrives with this thread's attributes;
- an open file is opened again, by its full path, at the same position (a file open
  for writing is not truncated); `sys.stdout` and its kind arrive as the check
  process's own;
- a generator that has not started arrives as a fresh call of its function; one that
  has run out, as an empty one.

What still cannot be carried (a generator half-way through, a socket, a frame) arrives
as a stand-in that raises, naming what it stands for, when a check touches it: only
the checks that use it fail, and they say why. Probe checks need none of this: their
probes run where the object is (see `smol.grading.core.serve_probes`).
"""

from __future__ import annotations

import inspect
import io
import os
import socket
import sys
import threading
import types

import cloudpickle

_LOCKS = {
    type(threading.Lock()): threading.Lock,
    type(threading.RLock()): threading.RLock,
}
_STREAMS = ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__")
_OTHERS = (
    types.CoroutineType,
    types.AsyncGeneratorType,
    types.FrameType,
    types.TracebackType,
    socket.socket,
)


class Uncarried:
    """Stands in for something the grader could not carry into the check's process;
    any use of it raises, saying what it stands for."""

    def __init__(self, what: str):
        object.__setattr__(self, "_what", what)

    def _refuse(self, *args, **kwargs):
        raise RuntimeError(
            f"{object.__getattribute__(self, '_what')} could not be carried from your "
            "notebook into the grader's check process; create it inside your "
            "function instead"
        )

    def __getattr__(self, name):
        self._refuse()

    def __repr__(self) -> str:
        return f"<not carried: {object.__getattribute__(self, '_what')}>"

    __call__ = __iter__ = __next__ = __enter__ = __exit__ = __getitem__ = _refuse
    __len__ = __bool__ = __setattr__ = _refuse


def _local(cls, attributes: dict):
    obj = cls.__new__(cls)
    obj.__dict__.update(attributes)
    return obj


def _stream(name: str):
    return getattr(sys, name)


def _reopen(name: str, mode: str, position, raw: bool, encoding, errors):
    text = {} if "b" in mode else {"encoding": encoding, "errors": errors}
    f = open(name, mode, buffering=0 if raw else -1, **text)  # noqa: SIM115
    if "a" not in mode:
        f.seek(position)
    return f


def _closed(name: str, mode: str):
    f = io.StringIO() if "b" not in mode else io.BytesIO()
    f.name, f.mode = name, mode  # noqa: B010
    f.close()
    return f


def _restart(fn, args, kwargs):
    return fn(*args, **kwargs)


def _exhausted():
    def empty():
        yield from ()

    gen = empty()
    gen.close()
    return gen


def _file(f: io.IOBase):
    """The reduction of an open file, or None where it has no path to reopen."""
    for name in _STREAMS:
        if f is getattr(sys, name, None):
            return _stream, (name,)
    name, mode = getattr(f, "name", None), getattr(f, "mode", "r")
    if not isinstance(name, str):
        return None
    name = os.path.abspath(name)  # the check's process runs elsewhere
    binary = not isinstance(f, io.TextIOBase)
    if f.closed:
        return _closed, (name, mode + ("b" if binary and "b" not in mode else ""))
    plus = "+" in mode
    if "a" in mode:
        again = "a+" if plus else "a"
    else:
        again = "r" if "r" in mode and not plus else "r+"  # w, x: never truncate
    try:
        if f.writable():
            f.flush()
        position = f.tell()
    except OSError:  # a pipe, a terminal: no position to come back to
        return None
    text = isinstance(f, io.TextIOWrapper)
    return _reopen, (
        name,
        again + ("b" if binary else ""),
        position,
        isinstance(f, io.FileIO),
        f.encoding if text else None,
        f.errors if text else None,
    )


def _generator(gen: types.GeneratorType):
    """A fresh call of a generator's function if it has not started, an empty one if
    it has run out, else None."""
    state = inspect.getgeneratorstate(gen)
    if state == inspect.GEN_CLOSED:
        return _exhausted, ()
    if state != inspect.GEN_CREATED:
        return None
    code, frame = gen.gi_code, gen.gi_frame
    values = frame.f_locals
    cells = tuple(types.CellType(values[name]) for name in code.co_freevars)
    fn = types.FunctionType(code, frame.f_globals, code.co_name, None, cells or None)
    names = code.co_varnames
    n, k = code.co_argcount, code.co_kwonlyargcount
    args = [values[name] for name in names[:n]]
    kwargs = {name: values[name] for name in names[n : n + k]}
    at = n + k
    if code.co_flags & inspect.CO_VARARGS:
        args += list(values[names[at]])
        at += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kwargs.update(values[names[at]])
    return _restart, (fn, tuple(args), kwargs)


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj):
        kind = type(obj)
        if kind in _LOCKS:
            return _LOCKS[kind], ()
        if isinstance(obj, threading.local):
            return _local, (kind, dict(obj.__dict__))
        reduced = None
        if isinstance(obj, io.IOBase) and not isinstance(
            obj, (io.BytesIO, io.StringIO)
        ):
            reduced = _file(obj)
            what = f"the file {getattr(obj, 'name', '?')!r}"
        elif isinstance(obj, types.GeneratorType):
            reduced = _generator(obj)
            what = f"the generator {obj.__qualname__} (already started)"
        elif isinstance(obj, _OTHERS):
            what = f"a {kind.__name__} object"
        else:
            return super().reducer_override(obj)
        return reduced if reduced is not None else (Uncarried, (what,))


def dumps(obj) -> bytes:
    """`obj` as bytes for `cloudpickle.loads`, carrying what plain pickling refuses."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=5).dump(obj)
    return buffer.getvalue()


def dump(obj, path: str) -> None:
    """Write `dumps(obj)` to `path` (what the grader runs in a notebook's kernel)."""
    data = dumps(obj)
    with open(path, "wb") as f:
        f.write(data)
