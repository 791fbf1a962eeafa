"""tests/python/*.py run by the machine's own CPython with the real
frameworks (PyTorch, JAX, TensorFlow where installed) on its GPU: what each
printed, its exit status and its last error line, as JSON on standard
output. `scripts/gpu-check.sh` writes it to tests/golden/python-snippets.json,
beside the `.out` files vramlab's shims must print.

    python3 tests/reference/python_snippets.py tests/python
"""

import glob
import importlib
import json
import os
import subprocess
import sys
import time


def versions():
    out = {"python": sys.version.split()[0]}
    for m in ("torch", "jax", "tensorflow"):
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


def main(folder):
    snippets = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.py"))):
        name = os.path.splitext(os.path.basename(path))[0]
        snippets[name] = run(path)
        print(name, snippets[name]["exit"], file=sys.stderr)
    json.dump({"versions": versions(), "snippets": snippets}, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/python")
