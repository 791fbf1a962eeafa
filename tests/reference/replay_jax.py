#!/usr/bin/env python3
"""Replays a vramlab command file in real JAX (XLA's BFC allocator, without
preallocation) on a CUDA GPU and prints one JSON line per command with
`vramlab run`'s stats keys: allocated = bytes_in_use, reserved = pool_bytes.

    python3 tests/reference/replay_jax.py FILE.jsonl > FILE.jax.jsonl

alloc is jnp.zeros of uint8 (or shape and dtype), then block_until_ready;
del, hold, gc; empty_cache does nothing (JAX has none); every restart is a
fresh process. A restart's smaller GPU (device_total_bytes) scales
XLA_PYTHON_CLIENT_MEM_FRACTION to the real one's memory, so that the pool
is the fraction of that GPU.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import replay  # noqa: E402


def environment(env, settings):
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true" if settings.get("preallocate", False) else "false"
    fraction = settings.get("mem_fraction")
    total = replay.gpu_total_bytes() if settings.get("device_total_bytes") else None
    if total:
        # XLA rounds its limit (fraction x CUDA's total) up to a MiB.
        limit = (0.75 if fraction is None else fraction) * int(settings["device_total_bytes"])
        fraction = (limit - 4096) / total
    if fraction is not None:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = repr(fraction)
    return env


class Jax(replay.Framework):
    def __init__(self):
        import jax
        import jax.numpy as jnp

        self.jnp = jnp
        self.device = jax.devices("gpu")[0]

    def alloc(self, cmd):
        jnp = self.jnp
        if "bytes" in cmd:
            t = jnp.zeros(int(cmd["bytes"]), jnp.uint8)
        else:
            t = jnp.zeros(tuple(cmd["shape"]), getattr(jnp, cmd.get("dtype", "float32")))
        return t.block_until_ready()

    def stats(self):
        s = self.device.memory_stats() or {}
        return {
            "allocated_bytes": int(s.get("bytes_in_use", 0)),
            "reserved_bytes": int(s.get("pool_bytes", s.get("bytes_reserved", 0))),
            "peak_allocated_bytes": int(s.get("peak_bytes_in_use", 0)),
            "peak_reserved_bytes": int(s.get("peak_pool_bytes", 0)),
            "device_total_bytes": int(s.get("bytes_limit", 0)),
        }

    def out_of_memory(self, error):
        return "RESOURCE_EXHAUSTED" in str(error)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--process":
        replay.play(Jax(), int(sys.argv[2]), sys.stdin.readlines())
    elif len(sys.argv) == 2:
        replay.drive(__file__, sys.argv[1], environment)
    else:
        sys.exit(__doc__)
