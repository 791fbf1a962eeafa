#!/usr/bin/env python3
"""Replays a vramlab command file in real PyTorch on a CUDA GPU and prints one
JSON line per command, with the stats keys `vramlab run` prints.

    python3 tests/reference/replay_pytorch.py FILE.jsonl > FILE.pytorch.jsonl

Commands: alloc (torch.empty(n, dtype=torch.uint8, device="cuda"), or shape and
dtype), del, hold (a list; with cycle, it holds itself), gc (gc.collect()),
empty_cache, reset_peak_memory_stats, and restart: every restart is a fresh
Python process (settings become PYTORCH_* environment variables), as
restarting a kernel is. Other commands are reported as unsupported.
"""
import json
import os
import subprocess
import sys

STATS = {
    "allocated_bytes": "allocated_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
    "active_bytes": "active_bytes.all.current",
    "requested_bytes": "requested_bytes.all.current",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "peak_allocated_bytes": "allocated_bytes.all.peak",
    "peak_reserved_bytes": "reserved_bytes.all.peak",
    "segments": "segment.all.current",
    "allocations": "allocation.all.current",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
    "num_device_alloc": "num_device_alloc",
    "num_device_free": "num_device_free",
}
ANNOTATIONS = ("say", "why", "expect")
DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"]


def segments(path):
    """The file split at restarts: (first step, lines, settings) per process."""
    lines = [l for l in open(path) if l.strip()]
    settings, out, current, start = {}, [], [], 0
    for i, line in enumerate(lines):
        cmd = json.loads(line)
        if cmd.get("cmd") == "restart":
            if current or i == 0:
                if current:
                    out.append((start, current, dict(settings)))
            settings.update({k: v for k, v in cmd.items() if k not in ANNOTATIONS and k != "cmd"})
            current, start = [line], i
        else:
            current.append(line)
    if current:
        out.append((start, current, dict(settings)))
    return out


def environment(settings):
    env = dict(os.environ)
    conf = []
    if settings.get("max_split_size_mb"):
        conf.append(f"max_split_size_mb:{settings['max_split_size_mb']}")
    if settings.get("garbage_collection_threshold"):
        conf.append(f"garbage_collection_threshold:{settings['garbage_collection_threshold']}")
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(conf)
        env["PYTORCH_ALLOC_CONF"] = ",".join(conf)
    if settings.get("no_caching"):
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env


def driver(path):
    for start, lines, settings in segments(path):
        if settings.get("framework", "pytorch") != "pytorch":
            for i, line in enumerate(lines):
                print(json.dumps({"step": start + i, "cmd": json.loads(line), "ok": False,
                                  "error": {"kind": "unsupported", "message": "not a PyTorch kernel"}}))
            continue
        proc = subprocess.run([sys.executable, __file__, "--process", str(start), json.dumps(settings)],
                              input="".join(lines), text=True, capture_output=True, env=environment(settings))
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            sys.exit(proc.returncode)


def process(start, settings):
    import gc
    import torch

    torch.cuda.init()
    if settings.get("per_process_memory_fraction") is not None:
        torch.cuda.set_per_process_memory_fraction(float(settings["per_process_memory_fraction"]))
    names = {}

    def stats():
        s = torch.cuda.memory_stats()
        out = {k: int(s.get(v, 0)) for k, v in STATS.items()}
        free, total = torch.cuda.mem_get_info()
        out["device_total_bytes"] = total
        out["device_free_bytes"] = free
        return out

    for i, line in enumerate(sys.stdin):
        cmd = {k: v for k, v in json.loads(line).items() if k not in ANNOTATIONS}
        kind = cmd.get("cmd")
        record = {"step": start + i, "cmd": cmd, "ok": True}
        try:
            if kind == "restart":
                pass  # this process is the restarted kernel
            elif kind == "alloc":
                if "bytes" in cmd:
                    t = torch.empty(int(cmd["bytes"]), dtype=torch.uint8, device="cuda")
                else:
                    dtype = getattr(torch, cmd.get("dtype", "float32"))
                    t = torch.empty(*cmd["shape"], dtype=dtype, device="cuda")
                names[cmd["name"]] = t
                del t
            elif kind == "del":
                if cmd["name"] not in names:
                    raise NameError(f"name '{cmd['name']}' is not defined")
                del names[cmd["name"]]
            elif kind == "hold":
                h = [names[n] if n in names else (_ for _ in ()).throw(NameError(f"name '{n}' is not defined"))
                     for n in cmd["items"]]
                if cmd.get("cycle"):
                    h.append(h)
                names[cmd["name"]] = h
                del h
            elif kind == "gc":
                gc.collect()
            elif kind == "empty_cache":
                torch.cuda.empty_cache()
            elif kind == "reset_peak_memory_stats":
                torch.cuda.reset_peak_memory_stats()
            else:
                record["ok"] = False
                record["error"] = {"kind": "unsupported", "message": f"{kind} is not replayed"}
        except torch.OutOfMemoryError as e:
            record["ok"] = False
            record["error"] = {"kind": "out_of_memory", "message": str(e)}
        except NameError as e:
            record["ok"] = False
            record["error"] = {"kind": "name_error", "message": str(e)}
        record["stats"] = stats()
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--process":
        process(int(sys.argv[2]), json.loads(sys.argv[3]))
    elif len(sys.argv) == 2:
        driver(sys.argv[1])
    else:
        sys.exit(__doc__)
