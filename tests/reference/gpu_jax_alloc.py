#!/usr/bin/env python3
"""What JAX's BFC allocator does for the ways a user makes an array on a
CUDA GPU: XLA's memory stats (bytes_in_use, peak_bytes_in_use, num_allocs,
pool_bytes, largest_free_block_bytes) before and after each, in one
process without preallocation. Prints JSON lines.

    XLA_PYTHON_CLIENT_PREALLOCATE=false python3 tests/reference/gpu_jax_alloc.py > tests/golden/jax-alloc.jsonl
    XLA_PYTHON_CLIENT_PREALLOCATE=false python3 tests/reference/gpu_jax_alloc.py repeat > tests/golden/jax-alloc-repeat.jsonl

`repeat`: in a fresh process, the same small `jnp.zeros` again and again
(the first call traces, later ones hit jit's cache), then a larger one twice.
"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

DEV = jax.devices("gpu")[0]
KEYS = ("bytes_in_use", "peak_bytes_in_use", "num_allocs", "pool_bytes", "largest_free_block_bytes",
        "largest_alloc_size", "bytes_limit")
live = []


def stats():
    s = DEV.memory_stats() or {}
    return {k: s.get(k) for k in KEYS}


def step(name, make):
    before = stats()
    x = make()
    x.block_until_ready()
    live.append(x)
    print(json.dumps({"op": name, "nbytes": x.nbytes, "before": before, "after": stats()}), flush=True)


if sys.argv[1:] == ["repeat"]:
    for _ in range(4):
        step("jnp.zeros(2, uint8)", lambda: jnp.zeros(2, jnp.uint8))
    for _ in range(2):
        step("jnp.zeros(842642, uint8)", lambda: jnp.zeros(842642, jnp.uint8))
    for _ in range(2):
        step("jax.random.normal((256, 256))", lambda: jax.random.normal(jax.random.key(0), (256, 256)))
    sys.exit(0)

step("jnp.zeros(99, uint8)", lambda: jnp.zeros(99, jnp.uint8))
step("jnp.zeros(3, uint8)", lambda: jnp.zeros(3, jnp.uint8))
step("jnp.zeros(1048576, uint8)", lambda: jnp.zeros(1048576, jnp.uint8))
step("jnp.zeros(6501820, uint8)", lambda: jnp.zeros(6501820, jnp.uint8))
step("jnp.ones(1048576, uint8)", lambda: jnp.ones(1048576, jnp.uint8))
step("jnp.zeros((256, 1024), float32)", lambda: jnp.zeros((256, 1024), jnp.float32))
step("jax.device_put(np.zeros(1048576, uint8))", lambda: jax.device_put(np.zeros(1048576, np.uint8), DEV))
step("jax.device_put(np.zeros(99, uint8))", lambda: jax.device_put(np.zeros(99, np.uint8), DEV))
step("jnp.empty(1048576, uint8)", lambda: jnp.empty(1048576, jnp.uint8))
step("jax.random.normal((1024, 1024))", lambda: jax.random.normal(jax.random.key(0), (1024, 1024)))
live.clear()
print(json.dumps({"op": "all deleted", "after": stats()}), flush=True)
step("jnp.zeros(1048576, uint8) after deletes", lambda: jnp.zeros(1048576, jnp.uint8))
