"""The messages between the page and the cell's Python, written from
their declaration (the engine's `protocol::python_worker`): do not
edit; a test holds this file to it."""


def loaded(bytes, ms, version):
    return {"type": "loaded", "bytes": bytes, "ms": ms, "version": version}


def statements(spans, framework):
    return {"type": "statements", "spans": spans, "framework": framework}


def syntax_error(line, message):
    return {"type": "syntax_error", "line": line, "message": message}


def begin(statement):
    return {"type": "begin", "statement": statement}


def line(line):
    return {"type": "line", "line": line}


def print(text, stream, at):
    return {"type": "print", "text": text, "stream": stream, "at": at}


def end(statement, error):
    return {"type": "end", "statement": statement, "error": error}


def idle(next):
    return {"type": "idle", "next": next}


# What the page sends: each message's type and its fields.
TO_PYTHON = {
    "load": ("code", "settings"),
    "step": ("count",),
}
