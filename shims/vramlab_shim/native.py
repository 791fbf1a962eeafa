"""The engine natively: `vramlab run -` in a child process, one JSON line
in and one record out per command (VRAMLAB_BIN names the binary;
VRAMLAB_RUN_ARGS adds its settings)."""

import json
import os
import shlex
import subprocess

_child = []


def _process():
    if not _child:
        binary = os.environ.get("VRAMLAB_BIN", "vramlab")
        args = shlex.split(os.environ.get("VRAMLAB_RUN_ARGS", ""))
        _child.append(
            subprocess.Popen(
                [binary, "run", "-"] + args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
        )
    return _child[0]


def execute(line):
    p = _process()
    p.stdin.write(line + "\n")
    p.stdin.flush()
    out = p.stdout.readline()
    if not out:
        raise RuntimeError("the vramlab engine stopped")
    log = os.environ.get("VRAMLAB_COMMANDS")
    if log:
        with open(log, "a") as f:
            f.write(line + "\n")
    return json.loads(out)
