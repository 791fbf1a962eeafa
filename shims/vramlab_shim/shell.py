"""`!command` lines, as IPython and Jupyter run them: the line goes to a
shell. Here the shell has one program, `nvidia-smi`, which prints the
session's GPU as the real one prints it: its memory used and total (every
process's, this one's CUDA context and reserved pool included) and this
process's own usage. Any other command says the shell is not here."""

import re
import shlex

import vramlab_shim as vs

MIB = 1 << 20


def transform(source):
    """The cell's code with each `!command` line (at any indentation) a call
    of `__vramlab_shell__`; line numbers are kept."""
    out = []
    for line in source.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith("!") and not stripped.startswith("!="):
            indent = line[: len(line) - len(stripped)]
            line = "%s__vramlab_shell__(%r)" % (indent, stripped[1:].strip())
        out.append(line)
    return "\n".join(out)


def run(command):
    """Runs one `!command` line."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    if not words or words[0] != "nvidia-smi":
        name = words[0] if words else ""
        print("/bin/sh: 1: %s: not found (vramlab's cell has no shell; it runs !nvidia-smi)" % name)
        return
    print(nvidia_smi(words[1:]), end="")


def _memory():
    s = vs.stats() or {}
    total = s.get("device_total_bytes", 0)
    mine = s.get("device_used_bytes", 0)
    others = s.get("other_processes_bytes", 0)
    return total, mine, others


def nvidia_smi(args):
    query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
    if query is not None:
        fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "csv")
        return _query(query.split(","), fmt.split(","))
    return _table()


def _query(fields, fmt):
    total, mine, others = _memory()
    used = mine + others
    values = {
        "name": (vs.DEVICE["name"], None),
        "gpu_name": (vs.DEVICE["name"], None),
        "memory.total": (total // MIB, "MiB"),
        "memory.used": (used // MIB, "MiB"),
        "memory.free": ((total - used) // MIB, "MiB"),
        "index": (0, None),
        "count": (1, None),
    }
    header, row = [], []
    for f in fields:
        f = f.strip()
        value, unit = values.get(f, ("[N/A]", None))
        header.append("%s [%s]" % (f, unit) if unit and "nounits" not in fmt else f)
        row.append(str(value) if unit is None or "nounits" in fmt else "%s %s" % (value, unit))
    lines = [] if "noheader" in fmt else [", ".join(header)]
    lines.append(", ".join(row))
    return "\n".join(lines) + "\n"


def _table():
    total, mine, others = _memory()
    used = (mine + others) // MIB
    name = vs.DEVICE["name"][:30]
    memory = "%dMiB / %dMiB" % (used, total // MIB)
    rule = "+-----------------------------------------+------------------------+----------------------+"
    lines = [
        "+-----------------------------------------------------------------------------------------+",
        "| NVIDIA-SMI (vramlab)           Driver Version: simulated      CUDA Version: simulated   |",
        rule,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|=========================================+========================+======================|",
        "|" + _cell("   0  " + name, "N/A ", 41) + "|" + _cell(" N/A", "N/A ", 24) + "|" + _cell("", "N/A ", 22) + "|",
        "|" + _cell(" N/A   N/A    N/A", "N/A /  N/A ", 41) + "|" + _cell("", memory + " ", 24) + "|"
        + _cell("      N/A", "Default ", 22) + "|",
        rule,
        "",
        "+-----------------------------------------------------------------------------------------+",
        "| Processes:                                                                              |",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|=========================================================================================|",
    ]
    if mine:
        lines.append(_process("python (this kernel)", mine))
    if others:
        lines.append(_process("other processes", others))
    if not mine and not others:
        lines.append("|  No running processes found                                                             |")
    lines.append("+-----------------------------------------------------------------------------------------+")
    return "\n".join(lines) + "\n"


def _cell(left, right, width):
    """`left` and `right` in a table cell `width` characters wide."""
    room = width - len(right)
    return left[:room].ljust(room) + right


def _process(name, used):
    return "|" + _cell("    0   N/A  N/A              N/A      C   " + name, "%dMiB " % (used // MIB), 89) + "|"
