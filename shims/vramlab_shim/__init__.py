"""The bridge between Python code and vramlab's engine.

Every GPU allocation the shims make is a command of the engine (one JSON
line); every Python object that owns device memory holds an engine name
and gives it back in ``__del__``, so CPython decides when memory is
freed: reference counts, cycles and ``gc.collect()`` included.

The engine is reached through ``vramlab_engine`` (a module the page's
Python worker registers) or, natively, through ``vramlab run -`` in a
child process (``vramlab python FILE``).
"""

import ast
import json
import sys

CELL = "<cell>"

try:  # In the page: the worker's engine, synchronous.
    import vramlab_engine as _engine

    from vramlab_shim import messages as _messages

    def _execute(line, at):
        record = json.loads(_engine.execute(line))
        # The session runs the same line (the page sends it on).
        _engine.emit(json.dumps(_messages.line(line)))
        return record

except ImportError:  # Natively: `vramlab run -` in a child process.
    from vramlab_shim import native as _native

    def _execute(line, at):
        return _native.execute(line)


class EngineError(Exception):
    """A command the engine refused for a reason Python would not raise."""


_errors = {}


def raises(kind, exception):
    """The exception a framework raises for the engine's error `kind`."""
    _errors[kind] = exception


FRAMEWORK = "pytorch"
_notes = []


def cell_line():
    """The cell's line running now (0 outside the cell)."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_filename == CELL:
            return f.f_lineno
        f = f.f_back
    return 0


_last = [None]


def command(cmd, /, **fields):
    """The engine's command `name` with its fields: the one place a shim
    builds a command (the engine's command table declares each name; the
    layers test holds every name the shims send to it)."""
    return {"cmd": cmd, **fields}


def run(cmd):
    """Runs one command; returns its value, or raises what the framework
    raises for the engine's error."""
    at = cell_line()
    record = _execute(json.dumps(cmd), at)
    _last[0] = record.get("stats") or _last[0]
    if record.get("ok"):
        return record
    error = record.get("error") or {}
    kind = error.get("kind", "")
    message = error.get("message", "the engine refused the command")
    exc = _errors.get(kind, EngineError)(message.replace(_FRAME_NOTE, ""))
    if _FRAME_NOTE in message:
        # The engine's exception object keeps the failed step's tensors:
        # this one holds it, so they go when CPython frees the exception
        # (at the end of its except block, or when its last name goes).
        _live.add("last_exception")
        exc.vramlab_frame = _Frame()
    try:
        raise exc
    finally:
        # This frame is in the traceback: its name for the exception
        # would make a cycle that real frameworks do not have.
        exc = None


# What the engine says of an exception that keeps a failed step's tensors.
_FRAME_NOTE = "\n(The exception's frame keeps the failed step's tensors alive: `del last_exception` frees them.)"


def stats():
    """The engine's numbers now: those after the last command (only a
    command changes them)."""
    return _last[0]


# ----- names ---------------------------------------------------------------

_live = set()
_count = [0]
_targets = {}


def _target_of(filename, line):
    """The name a cell line assigns to, when it assigns one name."""
    key = (filename, line)
    if key not in _targets:
        _targets[key] = None
        source = _sources.get(filename)
        if source is not None and 0 < line <= len(source):
            text = source[line - 1].strip()
            try:
                tree = ast.parse(text)
            except SyntaxError:
                tree = None
            if tree and tree.body and isinstance(tree.body[0], (ast.Assign, ast.AnnAssign)):
                node = tree.body[0]
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                if isinstance(target, ast.Name):
                    _targets[key] = target.id
                elif isinstance(target, ast.Attribute):
                    _targets[key] = target.attr
    return _targets[key]


_sources = {}


def set_source(text):
    _sources[CELL] = text.splitlines()
    _targets.clear()


def line_target():
    """The name the running cell line assigns to, if it assigns one."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename != CELL:
        f = f.f_back
    return _target_of(CELL, f.f_lineno) if f is not None else None


def fresh_name(hint=None):
    """An engine name for a new object: the name the cell line assigns to
    when free, else that name with a number."""
    hint = hint or line_target() or "t"
    name = hint
    while name in _live:
        _count[0] += 1
        name = "%s_%d" % (hint, _count[0])
    _live.add(name)
    return name


def make(cmd):
    """Runs a command that makes the object `cmd["name"]` (a name from
    `fresh_name`): if the engine refuses it, the name is free again."""
    try:
        return run(cmd)
    except BaseException:
        _live.discard(cmd["name"])
        raise


SILENT = [False]


def release(name):
    """The object named `name` died in Python: its reference goes."""
    if name in _live:
        _live.discard(name)
        if SILENT[0]:
            return
        try:
            run(command("del", name=name))
        except Exception:
            pass


def reset():
    _live.clear()
    _count[0] = 0


class Owner:
    """A Python object holding one engine name (a tensor's storage, a
    model, an optimizer): when CPython frees it, the engine lets go."""

    _name = None

    def __del__(self):
        name = self._name
        if name is not None:
            self._name = None
            release(name)


def reshaped(shape, size):
    """`shape` (ints, or one tuple or list of them) for `size` elements,
    its -1 filled; None when it does not hold `size` elements."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    shape = [int(d) for d in shape]
    known = 1
    for d in shape:
        known *= d if d != -1 else 1
    if -1 in shape:
        shape[shape.index(-1)] = size // known if known else 0
    n = 1
    for d in shape:
        n *= d
    return shape if n == size else None


class Shaped:
    """What an array says of its shape (numpy's and JAX's alike), from its
    `shape` and `itemsize`."""

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self):
        return self.size * self.itemsize

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def _reshaped(self, shape):
        new = reshaped(shape, self.size)
        if new is None:
            dims = tuple(shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)
            # numpy writes the shape without spaces: (2,2), (5,).
            raise ValueError("cannot reshape array of size %d into shape %s"
                             % (self.size, str(dims).replace(" ", "")))
        return new


DEVICE = {"name": "Tesla T4"}


def device_name():
    """The card's name as the driver gives it."""
    name = DEVICE["name"]
    return name[len("Simulated "):] if name.startswith("Simulated ") else name


class NotComputed(float):
    """A number the engine did not compute (a step run shape-only, an
    array's values): NaN in arithmetic, so nothing downstream mistakes it
    for a value, but it prints as what it is rather than as a divergence
    (`loss nan`), and what is computed from it stays one."""

    def __new__(cls, why="not computed"):
        self = float.__new__(cls, "nan")
        self.why = why
        return self

    def __repr__(self):
        return "nan (%s)" % self.why

    __str__ = __repr__

    def __format__(self, spec):
        return repr(self)

    def _with(self, other):
        # With a number it stays not computed; with anything else (a
        # tensor: `total_loss += loss`) that operand's own operator runs.
        return self if isinstance(other, (int, float)) else NotImplemented

    def _same(self):
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _with
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __pow__ = __rpow__ = _with
    __neg__ = __pos__ = __abs__ = _same


def note(text):
    """A line the run prints to say where its numbers may differ."""
    if text not in _notes:
        _notes.append(text)
        sys.stderr.write("vramlab: " + text + "\n")


class _Frame(Owner):
    """The failed step's frame, held by the exception raised from it."""

    _name = "last_exception"
