"""The lessons as Python (tests/lessons/NN-slug.kN.py, written by
`vramlab lesson-python`) run by CPython with the real frameworks on a GPU:
the framework's own allocated and reserved bytes after every top-level
statement and the peak of allocated bytes during it (PyTorch's peak is reset
at each mark; XLA's `peak_bytes_in_use` is the process's), as JSON on
standard output. `scripts/gpu-check.sh` writes it to
tests/golden/lessons-python.json; `cargo test --test golden` runs the same
instrumented source through the shims and compares every mark.

    python3 tests/reference/lesson_python_gpu.py tests/lessons > lessons-python.json
    python3 tests/reference/lesson_python_gpu.py --instrument FILE   # the source that runs
    python3 tests/reference/lesson_python_gpu.py tests/lessons 20- 21- --merge lessons-python.json
                                   # those lessons only, the earlier run's others kept
    python3 tests/reference/lesson_python_gpu.py --cards   # GPU_MODELS as JSON

With SNAPSHOTS=DIR, each PyTorch lesson also records PyTorch's own memory
snapshot (`_record_memory_history`, `_dump_snapshot`) as DIR/NAME.pickle,
for `vramlab replay` and `vramlab diff` against the shims' run.

A lesson's smaller GPU is stood in for by the real one: PyTorch's caching
allocator is limited to the bytes the lesson's GPU has free after its
context (`torch.cuda.set_per_process_memory_fraction`, whose limit makes the
allocator free its cache, retry and raise as a full device does), and JAX's
preallocation to the lesson's fraction of the lesson's card
(`XLA_PYTHON_CLIENT_MEM_FRACTION` scaled to the real card's total).
Lessons in TensorFlow run where it is installed. Those built on vramlab's
own models import them from tests/reference/vramlab_models: the GPT and the
CNN in plain PyTorch, op for op as step_trace.py traces them (with real
peft for LoRA).
"""

import ast
import concurrent.futures
import glob
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time

# The simulator's defaults where a lesson's settings name none
# (crates/device/src/framework.rs: DEFAULT_TOTAL_BYTES, DEFAULT_CONTEXT_BYTES).
DEFAULT_TOTAL_BYTES = 15837691904
DEFAULT_CONTEXT_BYTES = 314572800
# Seconds a lesson may run (LESSON_TIMEOUT in the environment).
LESSON_TIMEOUT = int(os.environ.get("LESSON_TIMEOUT", 240))
# The cards a lesson may name (crates/device/src/gpu.rs: GpuModel::spec): total
# bytes as cudaMemGetInfo reports them, and the context.
MIB = 1 << 20
GPU_MODELS = {
    "t4": (15104 * MIB, 300 * MIB),
    "l4": (22579 * MIB, 300 * MIB),
    "a100-40gb": (40335 * MIB, 300 * MIB),
    "a100-80gb": (81050 * MIB, 300 * MIB),
    "rtx-4090": (24218 * MIB, 300 * MIB),
    "h100-80gb": (85017493504, 618 * MIB),
    "h200": (143166 * MIB, 300 * MIB),
}

# The frameworks are imported by name: the shims' runner reads a cell's
# import lines to know its framework.
PRELUDE = '''import os as _os, importlib as _importlib, gc as _gc
def _vramlab_mark(n):
    # The mark's own objects must not set off CPython's collector.
    enabled = _gc.isenabled()
    _gc.disable()
    try:
        stats = {"pytorch": _torch_stats, "jax": _jax_stats, "tensorflow": _tf_stats}[_FRAMEWORK]()
        print("vramlab-mark", n, *stats, flush=True)
    finally:
        if enabled:
            _gc.enable()
def _torch_stats():
    torch = _importlib.import_module("torch")
    peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), peak
def _jax_stats():
    jax = _importlib.import_module("jax")
    s = jax.devices()[0].memory_stats() or {}
    return s.get("bytes_in_use", 0), s.get("pool_bytes", 0), s.get("peak_bytes_in_use", 0)
def _tf_stats():
    tf = _importlib.import_module("tensorflow")
    s = tf.config.experimental.get_memory_info("GPU:0")
    tf.config.experimental.reset_memory_stats("GPU:0")
    return s["current"], 0, s["peak"]
if _os.environ.get("VRAMLAB_GPU_LIMIT_BYTES"):
    torch = _importlib.import_module("torch")
    torch.cuda.set_per_process_memory_fraction(
        int(_os.environ["VRAMLAB_GPU_LIMIT_BYTES"]) / torch.cuda.mem_get_info()[1])
    if _os.environ.get("VRAMLAB_GPU_SNAPSHOT"):
        torch.cuda.memory._record_memory_history(max_entries=1000000)
        _importlib.import_module("atexit").register(
            torch.cuda.memory._dump_snapshot, _os.environ["VRAMLAB_GPU_SNAPSHOT"])
    del torch
'''


def settings_of(source):
    for line in source.splitlines():
        if line.startswith("# vramlab python --settings '"):
            return json.loads(line.split("'")[1])
    raise SystemExit("no settings line")


def instrument(source):
    """The lesson's statements, each followed by a mark of the framework's
    bytes (none after an import: JAX would start its backend early)."""
    settings = settings_of(source)
    out = ["_FRAMEWORK = %r" % settings.get("framework", "pytorch"), PRELUDE]
    for n, stmt in enumerate(ast.parse(source).body, 1):
        out.append(ast.get_source_segment(source, stmt))
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            out.append("_vramlab_mark(%d)" % n)
    return "\n".join(out) + "\n"


MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vramlab_models")


def skip_reason(source, settings):
    module = {"tensorflow": "tensorflow", "jax": "jax"}.get(settings.get("framework"), "torch")
    modules = [module] + (["vllm"] if "from vllm import" in source else [])
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as e:
            return "%s is not installed here (%s)" % (module, type(e).__name__)
    return None


def fraction_of(target, real_total):
    """The largest fraction of the real card whose bytes do not pass the
    lesson card's: `fraction * total` as XLA computes it in doubles."""
    f = target / real_total
    while f * real_total > target:
        f = math.nextafter(f, 0)
    return f


def environment(name, settings, real_total):
    path = [MODELS] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(path))
    total, context = GPU_MODELS[settings["gpu"]] if "gpu" in settings else (DEFAULT_TOTAL_BYTES,
                                                                             DEFAULT_CONTEXT_BYTES)
    total = settings.get("device_total_bytes", total)
    framework = settings.get("framework", "pytorch")
    if framework == "pytorch":
        if os.environ.get("SNAPSHOTS"):
            env["VRAMLAB_GPU_SNAPSHOT"] = os.path.join(os.environ["SNAPSHOTS"], name + ".pickle")
        env["VRAMLAB_GPU_LIMIT_BYTES"] = str(total - settings.get("context_bytes", context))
        if settings.get("expandable_segments"):
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    elif framework == "jax":
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true" if settings.get("preallocate", True) else "false"
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = repr(fraction_of(settings.get("mem_fraction", 0.75) * total, real_total))
    return env


def run(path, real_total):
    source = open(path).read()
    settings = settings_of(source)
    entry = {"file": os.path.basename(path), "settings": settings}
    reason = skip_reason(source, settings)
    if reason:
        entry["skipped"] = reason
        return entry
    code = instrument(source)
    with tempfile.TemporaryDirectory() as tmp:
        cell = os.path.join(tmp, "cell.py")
        open(cell, "w").write(code)
        start = time.time()
        try:
            p = subprocess.run([sys.executable, cell], capture_output=True, text=True, timeout=LESSON_TIMEOUT,
                               cwd=tmp, env=environment(entry["file"][:-3], settings, real_total))
        except subprocess.TimeoutExpired as e:
            text = lambda b: b.decode() if isinstance(b, bytes) else (b or "")
            p = subprocess.CompletedProcess(e.cmd, None, text(e.stdout), text(e.stderr) + "\ntimed out")
    marks, stdout = [], []
    for line in p.stdout.splitlines():
        if line.startswith("vramlab-mark "):
            marks.append([int(n) for n in line.split()[1:]])
        else:
            stdout.append(line)
    err = [l for l in p.stderr.splitlines() if l.strip()]
    entry.update(source=code, marks=marks, stdout="\n".join(stdout), exit=p.returncode,
                 last_error_line=err[-1] if p.returncode and err else None,
                 seconds=round(time.time() - start, 2))
    return entry


def versions():
    out = {"python": sys.version.split()[0]}
    for m in ("torch", "jax", "tensorflow", "transformers", "peft", "bitsandbytes"):
        try:
            out[m] = importlib.import_module(m).__version__
        except Exception as e:
            out[m] = "missing: %s" % type(e).__name__
    return out


def main(folder, prefixes, merge):
    """Runs the lessons whose names start with one of `prefixes` (all where
    none); with `merge`, an earlier run's file, keeps its other lessons."""
    real_total = int(subprocess.check_output(
        [sys.executable, "-c", "import torch; print(torch.cuda.mem_get_info()[1])"]).strip())
    files = sorted(f for f in glob.glob(os.path.join(folder, "*.k[0-9]*.py"))
                   if not prefixes or os.path.basename(f).startswith(tuple(prefixes)))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        lessons = list(pool.map(lambda f: run(f, real_total), files))
    for e in lessons:
        print(e["file"], e.get("skipped") or "exit %s" % e["exit"], file=sys.stderr)
    if merge:
        with open(merge) as f:
            earlier = json.load(f)["lessons"]
        ran = {e["file"] for e in lessons}
        lessons = sorted([e for e in earlier if e["file"] not in ran] + lessons, key=lambda e: e["file"])
    json.dump({"versions": versions(), "device_total_bytes": real_total, "lessons": lessons},
              sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--instrument"]:
        sys.stdout.write(instrument(open(sys.argv[2]).read()))
    elif sys.argv[1:2] == ["--cards"]:
        json.dump(GPU_MODELS, sys.stdout)
    else:
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("folder", nargs="?", default="tests/lessons")
        p.add_argument("prefixes", nargs="*", help="only the lessons whose file names start so")
        p.add_argument("--merge", help="an earlier lessons-python.json whose other lessons are kept")
        a = p.parse_args()
        main(a.folder, a.prefixes, a.merge)
