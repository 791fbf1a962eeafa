"""Runs a cell's code as CPython runs a script (``__name__ == "__main__"``),
one top-level statement at a time, each line's prints and commands said
with the line they came from."""

import ast
import gc
import json
import linecache
import sys
import traceback

import vramlab_shim as vs
from vramlab_shim import messages, missing, shell

SHIMS = ("torch", "tensorflow", "keras", "jax", "optax", "numpy", "tf_keras", "vramlab", "peft", "transformers")
_collect = gc.collect


def collect(generation=2):
    """gc.collect(): CPython's cycles (and the engine names they held), then
    the framework's own (Keras's layers and model refer to each other)."""
    found = _collect(generation)
    vs.run(vs.command("gc"))
    return found


def framework_of(tree):
    """The framework the code imports (PyTorch when it names none or several)."""
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for n in names:
            root = n.split(".")[0]
            fw = {"torch": "pytorch", "tensorflow": "tensorflow", "keras": "tensorflow", "jax": "jax",
                  "optax": "jax", "flax": "jax"}.get(root)
            if fw and fw not in found:
                found.append(fw)
    return found[0] if len(found) == 1 else "pytorch"


class Output:
    """sys.stdout or sys.stderr (`stream`): each write said with the cell
    line that printed it."""

    def __init__(self, emit, stream):
        self.emit = emit
        self.stream = stream

    def write(self, text):
        if text:
            self.emit(messages.print(text, self.stream, vs.cell_line()))
        return len(text)

    def flush(self):
        pass


# CPython's tokenizer refuses brackets nested 200 deep (MAXLEVEL); its
# parser recurses once a level first, which in the page's CPython (wasm,
# a small stack) overflowed before the tokenizer said so.
MAX_NESTING = 200


def check_nesting(source):
    """CPython's SyntaxError for brackets nested too deep, found by the
    tokenizer alone (no recursion), before the parser runs."""
    import io
    import tokenize

    depth = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type != tokenize.OP:
                continue
            if tok.string in "([{":
                depth += 1
                if depth >= MAX_NESTING:
                    raise SyntaxError(
                        "too many nested parentheses",
                        (vs.CELL, tok.start[0], tok.start[1] + 1, tok.line),
                    )
            elif tok.string in ")]}":
                depth -= 1
    except tokenize.TokenError:
        pass  # unbalanced or unfinished: the parser says what is wrong


class Run:
    def __init__(self, source, emit, restart):
        self.emit = emit
        self.source = source
        transformed = shell.transform(source)
        check_nesting(transformed)
        self.tree = ast.parse(transformed, vs.CELL)
        self.statements = self.tree.body
        self.next = 0
        self.framework = framework_of(self.tree)
        forget_previous()
        vs.set_source(source)
        linecache.cache[vs.CELL] = (len(source), None, source.splitlines(True), vs.CELL)
        self.globals = {"__name__": "__main__", "__builtins__": __builtins__, "__vramlab_shell__": shell.run}
        missing.install()
        restart(self.framework)
        gc.collect = collect

    def spans(self):
        return [[s.lineno, s.end_lineno] for s in self.statements]

    def step(self, count):
        """Runs up to `count` statements; False once one raised."""
        while count > 0 and self.next < len(self.statements):
            count -= 1
            i = self.next
            self.next += 1
            node = self.statements[i]
            self.emit(messages.begin(i))
            error = None
            try:
                code = compile(ast.Module(body=[node], type_ignores=[]), vs.CELL, "exec")
                exec(code, self.globals)
            except BaseException as e:  # what Python prints, the cell's frames only
                error = describe(e)
                self.next = len(self.statements)
            self.emit(messages.end(i, error))
            if error:
                return False
        return True


def describe(e):
    tb = e.__traceback__
    frames = [f for f in traceback.extract_tb(tb) if f.filename == vs.CELL]
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(e), e)
    at = frames[-1].lineno if frames else 0
    return {"text": "".join(lines), "line": at, "type": type(e).__name__}


def forget_previous():
    """The last run's objects and modules go without a word to the engine
    (which restarts)."""
    vs.SILENT[0] = True
    try:
        for name in list(sys.modules):
            if name.split(".")[0] in SHIMS:
                del sys.modules[name]
        _collect()
    finally:
        vs.SILENT[0] = False
    vs.reset()


# ----- in the page: the worker hands every message from the page here ----------

_run = [None]


def handle(message):
    import vramlab_engine

    def emit(m):
        vramlab_engine.emit(json.dumps(m))

    m = json.loads(message)
    kind = m.get("type")
    if kind not in messages.TO_PYTHON:
        return
    if kind == "load":
        _run[0] = None
        settings = json.dumps(m.get("settings") or {})

        def restart(fw):
            line = json.dumps(vs.command("restart", framework=fw))
            record = json.loads(vramlab_engine.restart(settings, line))
            vs.DEVICE["name"] = (record.get("device") or {}).get("name", vs.DEVICE["name"])

        try:
            r = Run(m["code"], emit, restart)
        except SyntaxError as e:
            emit(messages.syntax_error(e.lineno or 0, "%s: %s" % (type(e).__name__, e.msg)))
            return
        _run[0] = r
        emit(messages.statements(r.spans(), r.framework))
    if kind == "step" and _run[0] is not None:
        r = _run[0]
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = Output(emit, "stdout"), Output(emit, "stderr")
        try:
            r.step(m["count"])
        finally:
            sys.stdout, sys.stderr = out, err
        emit(messages.idle(r.next))


def loaded():
    """Pyodide has loaded (in the page): what it took, as the browser
    counted the bytes, and the versions."""
    import js
    import pyodide
    import vramlab_engine

    resources = js.performance.getEntriesByType("resource")
    size = sum(int(e.transferSize) for e in resources)
    version = "%s (Pyodide %s)" % (sys.version.split()[0], pyodide.__version__)
    vramlab_engine.emit(json.dumps(messages.loaded(size, round(js.performance.now()), version)))


# ----- natively: vramlab python FILE ---------------------------------------------


def main(path):
    with open(path) as f:
        source = f.read()

    def restart(fw):
        import os

        settings = json.loads(os.environ.get("VRAMLAB_SETTINGS") or "{}")
        settings.update(vs.command("restart", framework=fw))
        record = vs.run(settings)
        vs.DEVICE["name"] = (record.get("device") or {}).get("name", vs.DEVICE["name"])

    def emit(m):
        if m["type"] == "end" and m["error"]:
            sys.stderr.write(m["error"]["text"])

    try:
        r = Run(source, emit, restart)
    except SyntaxError:
        traceback.print_exc(limit=0)
        return 1
    ok = r.step(len(r.statements))
    s = vs.stats()
    sys.stderr.write(
        "vramlab: allocated %d, reserved %d, peak allocated %d, peak reserved %d bytes\n"
        % (s["allocated_bytes"], s["reserved_bytes"], s["peak_allocated_bytes"], s["peak_reserved_bytes"])
    )
    return 0 if ok else 1
