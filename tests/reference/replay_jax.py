#!/usr/bin/env python3
"""Replays a vramlab command file in real JAX (XLA's BFC allocator, without
preallocation) on a CUDA GPU and prints one JSON line per command with
`vramlab run`'s stats keys: allocated = bytes_in_use, reserved = pool_bytes.

    XLA_PYTHON_CLIENT_PREALLOCATE=false python3 tests/reference/replay_jax.py FILE.jsonl

Commands: alloc (jnp.zeros of uint8, or shape and dtype), del, hold, gc,
empty_cache (JAX has none: nothing happens), restart (a fresh process).
"""
import json
import os
import subprocess
import sys

ANNOTATIONS = ("say", "why", "expect")


def segments(path):
    lines = [l for l in open(path) if l.strip()]
    out, current, start = [], [], 0
    for i, line in enumerate(lines):
        if json.loads(line).get("cmd") == "restart" and current:
            out.append((start, current))
            current, start = [], i
        current.append(line)
    if current:
        out.append((start, current))
    return out


def driver(path):
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    for start, lines in segments(path):
        proc = subprocess.run([sys.executable, __file__, "--process", str(start)],
                              input="".join(lines), text=True, capture_output=True, env=env)
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            sys.exit(proc.returncode)


def process(start):
    import gc
    import jax
    import jax.numpy as jnp

    device = jax.devices("gpu")[0]
    names = {}

    def stats():
        s = device.memory_stats() or {}
        return {
            "allocated_bytes": int(s.get("bytes_in_use", 0)),
            "reserved_bytes": int(s.get("pool_bytes", s.get("bytes_reserved", 0))),
            "peak_allocated_bytes": int(s.get("peak_bytes_in_use", 0)),
            "peak_reserved_bytes": int(s.get("peak_pool_bytes", 0)),
            "device_total_bytes": int(s.get("bytes_limit", 0)),
        }

    for i, line in enumerate(sys.stdin):
        cmd = {k: v for k, v in json.loads(line).items() if k not in ANNOTATIONS}
        kind = cmd.get("cmd")
        record = {"step": start + i, "cmd": cmd, "ok": True}
        try:
            if kind == "restart" or kind == "empty_cache":
                pass
            elif kind == "alloc":
                if "bytes" in cmd:
                    t = jnp.zeros(int(cmd["bytes"]), jnp.uint8)
                else:
                    t = jnp.zeros(tuple(cmd["shape"]), getattr(jnp, cmd.get("dtype", "float32")))
                t.block_until_ready()
                names[cmd["name"]] = t
                del t
            elif kind == "del":
                if cmd["name"] not in names:
                    raise NameError(f"name '{cmd['name']}' is not defined")
                del names[cmd["name"]]
            elif kind == "hold":
                h = [names[n] for n in cmd["items"]]
                if cmd.get("cycle"):
                    h.append(h)
                names[cmd["name"]] = h
                del h
            elif kind == "gc":
                gc.collect()
            else:
                record["ok"] = False
                record["error"] = {"kind": "unsupported", "message": f"{kind} is not replayed"}
        except KeyError as e:
            record["ok"] = False
            record["error"] = {"kind": "name_error", "message": f"name {e} is not defined"}
        except NameError as e:
            record["ok"] = False
            record["error"] = {"kind": "name_error", "message": str(e)}
        except Exception as e:  # XlaRuntimeError: RESOURCE_EXHAUSTED
            record["ok"] = False
            record["error"] = {"kind": "out_of_memory", "message": str(e)}
        record["stats"] = stats()
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--process":
        process(int(sys.argv[2]))
    elif len(sys.argv) == 2:
        driver(sys.argv[1])
    else:
        sys.exit(__doc__)
