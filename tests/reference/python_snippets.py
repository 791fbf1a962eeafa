"""tests/python/*.py run by the machine's own CPython with the real
frameworks (PyTorch, JAX, TensorFlow where installed) on its GPU: what each
printed, its exit status and its last error line, as JSON on standard
output. `scripts/gpu-check.sh` writes it to tests/golden/python-snippets.json,
beside the `.out` files vramlab's shims must print.

    python3 tests/reference/python_snippets.py tests/python [PREFIX...] [--merge FILE]

With prefixes, only the snippets whose names start so run; `--merge` keeps
an earlier run's other snippets.
"""

import concurrent.futures
import glob
import importlib
import json
import os
import subprocess
import sys
import time


def versions():
    out = {"python": sys.version.split()[0]}
    for m in ("torch", "jax", "tensorflow", "transformers", "peft", "bitsandbytes"):
        try:
            out[m] = importlib.import_module(m).__version__
        except Exception as e:  # not installed here
            out[m] = "missing: %s" % type(e).__name__
    return out


def run(path):
    start = time.time()
    try:
        path = os.path.abspath(path)
        p = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=120,
                           cwd=os.path.dirname(path))
        stdout, rc, err = p.stdout, p.returncode, p.stderr
    except subprocess.TimeoutExpired as e:
        stdout, rc, err = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), None, "timeout"
    last = [l for l in err.splitlines() if l.strip()]
    return {"stdout": stdout, "exit": rc, "last_error_line": last[-1] if rc else None,
            "seconds": round(time.time() - start, 2)}


# These see the whole device (its free memory, or XLA preallocating 75% of
# it), so they run alone; the others measure their own process and run
# side by side.
ALONE = ("jax", "mem-get-info", "oom", "nvidia-smi")


def main(folder, prefixes, merge):
    paths = sorted(p for p in glob.glob(os.path.join(folder, "*.py"))
                   if not prefixes or os.path.basename(p).startswith(tuple(prefixes)))
    name = lambda path: os.path.splitext(os.path.basename(path))[0]
    alone = [p for p in paths if any(a in name(p) for a in ALONE)]
    together = [p for p in paths if p not in alone]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        runs = dict(zip(map(name, together), pool.map(run, together)))
    runs.update((name(p), run(p)) for p in alone)
    snippets = {n: runs[n] for n in map(name, paths)}
    for n, r in snippets.items():
        print(n, r["exit"], file=sys.stderr)
    if merge:
        with open(merge) as f:
            snippets = dict(json.load(f)["snippets"], **snippets)
    json.dump({"versions": versions(), "snippets": snippets}, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("folder", nargs="?", default="tests/python")
    p.add_argument("prefixes", nargs="*")
    p.add_argument("--merge")
    a = p.parse_args()
    main(a.folder, a.prefixes, a.merge)
